"""Issue 25 item 6: one tenant's flood of long tasks never holds every worker slot.

A tenant runs at most ``concurrency - MCPTASKS_WORKER_TENANT_RESERVED_SLOTS`` tools at once in
one worker, and the claim ranks tenants with the fewest runs in the worker first, so another
tenant's short task starts at once, on a real worker process (PostgreSQL + Redis).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from mcptasks.tools.registry import Registry
from mcptasks.worker.loop import Worker
from tests.support.client import McpClient
from tests.support.factories import make_auth, task_row
from tests.support.requirements import require_multiprocess
from tests.support.servers import Stack, make_stack
from tests.support.waiting import wait_for

TERMINAL = ("completed", "failed", "cancelled")

reg = Registry()


@reg.tool(task_support="optional")
async def fair_sleep() -> str:
    return "ok"


def _running(stack: Stack, slug: str) -> int:
    """Live tasks of tenant ``slug`` that a worker holds a lease on."""
    with psycopg.connect(stack.env["DATABASE_URL"], autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM mcptasks_task t JOIN tenants_tenant n ON n.id = t.tenant_id "
            "WHERE n.slug = %s AND t.status = 'working' AND t.lease_expires_at > now()", [slug]
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.processes(reason="a stack of its own: daphne and a worker")
def test_a_flood_of_long_tasks_leaves_a_slot_for_another_tenant(tmp_path: Path) -> None:
    require_multiprocess()
    # A database of its own: no task left by another test for this worker to claim.
    stack, teardown = make_stack(tmp_path)
    web = stack.daphne(embedded_worker=False)
    worker = stack.worker(concurrency=4)
    flood_ids: list[str] = []
    try:
        with McpClient(web.url, token=stack.token("fair-a", "mallory")) as a, \
                McpClient(web.url, token=stack.token("fair-b", "bob")) as b:
            a.initialize()
            b.initialize()
            # Tenant A queues more ten-minute sleeps than the worker has slots.
            flood_ids = [a.call_task("demo_sleep", {"ms": 600_000})["taskId"] for _ in range(8)]
            wait_for("tenant A's sleeps to fill the worker", lambda: _running(stack, "fair-a") >= 3)
            started = time.monotonic()
            short = b.call_task("demo_sleep", {"ms": 10})["taskId"]

            def finished() -> dict[str, Any] | None:
                task = b.request("tasks/get", {"taskId": short}).result
                return task if task["status"] in TERMINAL else None

            done = wait_for("tenant B's short task to finish", finished, timeout=8, every=0.1)
            assert done["status"] == "completed", done
            assert time.monotonic() - started < 8
            # The flood never held more than concurrency minus the reserved slot.
            assert _running(stack, "fair-a") == 3
            for tid in flood_ids:
                a.request("tasks/cancel", {"taskId": tid})
    finally:
        worker.terminate(timeout=10)
        web.terminate(timeout=10)
        teardown()


@pytest.mark.django_db
def test_claim_caps_each_tenant_and_ranks_the_least_busy_first(settings: Any) -> None:
    """In-process (any backend): the claim itself, with the worker's own counts."""
    flood, other = make_auth(), make_auth()
    for _ in range(10):
        task_row("fair_sleep", auth=flood)
    late = task_row("fair_sleep", auth=other)
    w = Worker(concurrency=4, worker_id="fair", registry_=reg, run_cleanup=False)
    first = w._claim(4)
    by_tenant: dict[int, int] = {}
    for t in first:
        by_tenant[t.tenant_id] = by_tenant.get(t.tenant_id, 0) + 1
    assert by_tenant == {flood.tenant_id: 3, other.tenant_id: 1}
    assert late.task_id in {t.task_id for t in first}
    # A second worker's claim knows nothing of the first one's runs: it too keeps a slot free.
    second = Worker(concurrency=4, worker_id="fair-2", registry_=reg, run_cleanup=False)._claim(4)
    assert [t.tenant_id for t in second] == [flood.tenant_id] * 3
    settings.MCPTASKS = {**settings.MCPTASKS, "WORKER_TENANT_RESERVED_SLOTS": 0}
    assert len(Worker(concurrency=4, worker_id="fair-3", registry_=reg, run_cleanup=False)._claim(4)) == 4
