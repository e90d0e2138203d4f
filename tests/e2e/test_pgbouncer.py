"""The whole service behind PgBouncer 1.18 in transaction mode (``MCPTASKS_DB_POOLER=transaction``).

Two web processes and two workers reach PostgreSQL only through a private PgBouncer
(``pool_mode = transaction``, a small server pool, so clients share server connections), while
``migrate`` runs directly against PostgreSQL as docs/operations.md says. Under a load of a few
hundred tasks, ``mcptasks_audit verify`` and the CSV export run through the pooler too. Before
the pooler mode, every process fell back to the ORM (the async reads' startup option and named
prepared statements) and ``verify``/the export lost their ``WITH HOLD`` cursors.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.client import McpClient
from tests.support.pgbouncer_proc import PrivatePgBouncer
from tests.support.requirements import require_multiprocess
from tests.support.servers import REPO, Proc, Stack
from tests.support.waiting import wait_for

TASKS = 240
CLIENTS = 6
TERMINAL = {"completed", "failed", "cancelled"}


@pytest.fixture(scope="module")
def bouncer(stack: Stack) -> Iterator[PrivatePgBouncer]:
    """A private PgBouncer in front of the stack's PostgreSQL."""
    require_multiprocess()
    b = PrivatePgBouncer(stack.env["DATABASE_URL"], pool_size=3)
    b.start()
    yield b
    b.stop()


def _problems(log: str) -> list[str]:
    """Lines of a process log that show an error or a fallback from the async path."""
    signs = (" ERROR ", "CRITICAL", "Traceback", "async read failed", "prepared statement", "write dropped",
             "does not exist")
    return [line for line in log.splitlines() if any(sign in line for sign in signs)]


def _load(url: str, token: str, count: int, seen: list[dict[str, Any]], errors: list[str]) -> None:
    """Create ``count`` tasks on ``url`` and wait for each to finish (tasks/get)."""
    try:
        with McpClient(url, token=token) as c:
            c.initialize()
            ids = []
            for n in range(count):
                ids.append(c.call_task("test_tick", {"n": n})["taskId"])
            for task_id in ids:
                def done(tid: str = task_id) -> dict[str, Any] | None:
                    task = c.request("tasks/get", {"taskId": tid}).result
                    return task if task["status"] in TERMINAL else None

                seen.append(wait_for(f"task {task_id} finished", done, timeout=60, every=0.1))
    except Exception as exc:  # reported by the test
        errors.append(repr(exc))


def test_two_web_and_two_workers_through_pgbouncer_transaction_mode(stack: Stack, bouncer: PrivatePgBouncer) -> None:
    env = {"DATABASE_URL": bouncer.url_for(stack.env["DATABASE_URL"]), "MCPTASKS_DB_POOLER": "transaction"}
    token = stack.token("bouncer", "alice")
    out = stack.manage("mcptasks_tenant", "operator", "bouncer-aud", "--role", "auditor", "--tenant", "bouncer")
    found = re.search(r"with password (\S+)", out.stdout)
    assert found, out.stdout
    basic = "Basic " + base64.b64encode(f"bouncer-aud:{found.group(1)}".encode()).decode()
    procs: list[Proc] = []
    try:
        webs = [stack.daphne(embedded_worker=False, extra_env=env) for _ in range(2)]
        procs += webs
        procs += [stack.worker(concurrency=8, extra_env=env) for _ in range(2)]
        seen: list[dict[str, Any]] = []
        errors: list[str] = []
        threads = [
            threading.Thread(target=_load, args=(webs[i % 2].url, token, TASKS // CLIENTS, seen, errors))
            for i in range(CLIENTS)
        ]
        for t in threads:
            t.start()
        # During the load: the audit chains are verified and exported through the pooler.
        verified = exports = 0
        while any(t.is_alive() for t in threads) or verified < 3:
            result = subprocess.run(
                [sys.executable, "manage.py", "mcptasks_audit", "verify"], cwd=REPO,
                env={**os.environ, **stack.env, **env}, capture_output=True, text=True, timeout=120,
            )
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
            verified += 1
            for web in webs:
                resp = httpx.get(f"{web.base}/api/tenants/bouncer/audit-events/", params={"format": "csv"},
                                 headers={"Authorization": basic}, timeout=30)
                assert resp.status_code == 200, resp.text[:500]
                assert resp.text.splitlines()[0].startswith("id,"), resp.text[:200]
                exports += 1
            assert "broken" not in result.stdout.lower()
        for t in threads:
            t.join(120)
        assert errors == []
        assert len(seen) == TASKS
        assert {t["status"] for t in seen} == {"completed"}
        assert verified >= 3 and exports >= 6
        # Every creation is in the export (read through the pooler, after the load).
        resp = httpx.get(f"{webs[0].base}/api/tenants/bouncer/audit-events/",
                         params={"format": "csv", "action": "task.create"}, headers={"Authorization": basic},
                         timeout=30)
        assert resp.status_code == 200
        assert len(resp.text.strip().splitlines()) - 1 >= TASKS
    finally:
        for p in procs:
            p.terminate(timeout=15)
    problems = {p.log.name: _problems(p.log_text()) for p in procs}
    assert all(not lines for lines in problems.values()), problems
