"""A host lost inside a transaction does not freeze its tenant for hours, nor other tenants.

Issue 28 item 6: task creation updates the tenant's row; a process that holds that row lock and
then vanishes (SIGSTOP here: its TCP connection stays up, nothing answers, as for a host gone
without FIN/RST) used to leave the transaction open for the OS keepalive default (~2 h), every
write thread of every web process blocked behind it, and another tenant's ``initialize`` timing
out. Now the lock holder's own connection is closed by the server after
``DB_IDLE_IN_TRANSACTION_TIMEOUT_MS``, waiting writers give up after ``DB_LOCK_TIMEOUT_MS``
(503, retryable), and a write that finds no free thread within ``WRITE_QUEUE_TIMEOUT_S`` is
answered 503 at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.client import McpClient
from tests.support.requirements import require_multiprocess
from tests.support.servers import REPO, Stack, web_and_worker
from tests.support.waiting import wait_for

IDLE_TIMEOUT_S = 6.0
BOUNDS = {
    "MCPTASKS_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS": str(int(IDLE_TIMEOUT_S * 1000)),
    "MCPTASKS_DB_LOCK_TIMEOUT_MS": "1000",
    "MCPTASKS_WRITE_QUEUE_TIMEOUT_S": "2",
}

LOCKER = """
import sys, time
from django.db import connection, transaction
from tenants.models import Tenant
with transaction.atomic():
    assert list(Tenant.objects.select_for_update().filter(slug=sys.argv[-1]))
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        print("locked", cur.fetchone()[0], flush=True)
    time.sleep(600)
"""


@pytest.fixture
def locker(stack: Stack) -> Iterator[Any]:
    """Start a process (the service's own settings) that locks a tenant's row and waits."""
    started: list[subprocess.Popen[str]] = []

    def start(slug: str) -> tuple[subprocess.Popen[str], int]:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import django; django.setup(); exec(open(0).read())", slug],
            cwd=REPO, env={**os.environ, **stack.env, **BOUNDS, "DJANGO_SETTINGS_MODULE": "mcptasks.settings"},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        started.append(proc)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(LOCKER)
        proc.stdin.close()
        line = proc.stdout.readline()
        assert line.startswith("locked "), line + proc.stdout.read()
        return proc, int(line.split()[1])

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(10)


def _create(c: McpClient, n: int) -> tuple[int, str | None, float]:
    """(HTTP status, taskId or None, seconds) of one task creation."""
    t0 = time.monotonic()
    reply = c.request("tools/call", {"name": "test_tick", "arguments": {"n": n}, "task": {}})
    task_id = reply.result["task"]["taskId"] if reply.status == 200 and "result" in (reply.message or {}) else None
    return reply.status, task_id, time.monotonic() - t0


def test_a_frozen_lock_holder_blocks_neither_other_tenants_nor_its_own_for_long(stack: Stack, locker: Any) -> None:
    require_multiprocess()
    token_a, token_b = stack.token("frozen-a", "alice"), stack.token("frozen-b", "bob")
    with web_and_worker(stack, env=BOUNDS) as web:
        clients_a = [McpClient(web.url, token=token_a, timeout=60) for _ in range(6)]
        for c in clients_a:
            c.initialize()
        holder, holder_pid = locker("frozen-a")
        holder.send_signal(signal.SIGSTOP)  # the host is gone: the connection stays, nothing answers
        frozen_at = time.monotonic()
        # Tenant A's writers pile up on the lock: more of them than there are write threads.
        outcomes: list[tuple[int, str | None, float]] = []
        threads = [threading.Thread(target=lambda c=c, n=n: outcomes.append(_create(c, n)))
                   for n, c in enumerate(clients_a)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        # Another tenant is unaffected meanwhile: a new session and a task, promptly.
        with McpClient(web.url, token=token_b, timeout=60) as b:
            t0 = time.monotonic()
            b.initialize()
            status, b_task, _ = _create(b, 1000)
            b_elapsed = time.monotonic() - t0
        assert status == 200 and b_task is not None
        assert b_elapsed < 5.0, b_elapsed
        for t in threads:
            t.join(60)
        # A's waiting writers never hung: each got its task or a retryable 503.
        assert len(outcomes) == len(clients_a)
        assert all(s == 200 and tid or s == 503 for s, tid, _ in outcomes), outcomes
        assert max(secs for _, _, secs in outcomes) < 10.0, outcomes
        # Tenant A recovers once the server closes the frozen transaction (idle timeout).
        retry = clients_a[0]
        status_id = wait_for("tenant A accepts tasks again",
                             lambda: (r := _create(retry, 2000))[0] == 200 and r[1], timeout=IDLE_TIMEOUT_S + 20,
                             every=0.5)
        assert time.monotonic() - frozen_at < IDLE_TIMEOUT_S + 20
        # The server ended the frozen transaction (the holder, still stopped, was not asked).
        assert not _backend_alive(stack, holder_pid)
        # Nothing lost: every task a creation answered with exists and completes; a 503 left none.
        created = [tid for s, tid, _ in outcomes if s == 200 and tid] + [str(status_id)]
        for tid in created:
            wait_for(f"task {tid} completed",
                     lambda tid=tid: retry.request("tasks/get", {"taskId": tid}).result["status"] == "completed",
                     timeout=30, every=0.2)
        assert _task_count(stack, "frozen-a") == len(created)
        for c in clients_a:
            c.close()
        log = web.log_text()
    assert "Traceback" not in log, log[-3000:]


def _sql_one(stack: Stack, query: str, params: tuple[Any, ...] = ()) -> Any:
    import psycopg

    with psycopg.connect(stack.env["DATABASE_URL"], autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
        assert row is not None
        return row[0]


def _backend_alive(stack: Stack, pid: int) -> bool:
    return bool(_sql_one(stack, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)))


def _task_count(stack: Stack, slug: str) -> int:
    return int(_sql_one(stack, "SELECT count(*) FROM mcptasks_task t JOIN tenants_tenant n ON n.id = t.tenant_id "
                               "WHERE n.slug = %s AND t.kind = 'task'", (slug,)))
