"""Issue 11 fault test: PostgreSQL restarted (immediate mode) under load; the service recovers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.e2e.live_support import wait_status
from tests.support.client import McpClient
from tests.support.pg_proc import PrivatePostgres
from tests.support.requirements import require_multiprocess, skip_or_fail
from tests.support.servers import Proc, Stack, web_and_worker

TERMINAL = {"completed", "failed", "cancelled"}


@pytest.fixture(scope="module")
def pg() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    if not server.available:
        skip_or_fail("initdb/pg_ctl are not installed: cannot run a private PostgreSQL")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def web(stack: Stack, pg: PrivatePostgres) -> Iterator[Proc]:
    if not stack.multi_process:
        require_multiprocess()
    env = {"DATABASE_URL": pg.url}
    stack.manage("migrate", "--noinput", extra_env=env)
    with web_and_worker(stack, env=env, concurrency=8) as proc:
        yield proc


def test_service_recovers_from_an_immediate_postgres_restart(web: Proc, pg: PrivatePostgres) -> None:
    with McpClient(web.url, timeout=20) as c:
        c.initialize()
        done = c.call_task("demo_sleep", {"ms": 0})["taskId"]
        wait_status(c, done, TERMINAL)
        in_flight = [c.call_task("demo_sleep", {"ms": 2500})["taskId"] for _ in range(6)]
        statuses: list[int] = []
        stop = threading.Event()

        def poll() -> None:
            with McpClient(web.url, timeout=20) as p:
                p.session_id, p.protocol_version = c.session_id, c.protocol_version
                while not stop.is_set():
                    reply = p.request("tasks/get", {"taskId": done})
                    statuses.append(reply.status)
                    if reply.status not in (200, 503):
                        break
                    time.sleep(0.05)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        time.sleep(0.5)
        pg.restart_immediate()
        time.sleep(3)
        stop.set()
        poller.join(30)
        assert not poller.is_alive(), "a request hung"
        assert set(statuses) <= {200, 503}, statuses
        assert statuses[-1] == 200, "the web process did not recover by itself"
        # No task lost or stuck: each ends terminal (a run cut by the restart may be re-run).
        finals = [wait_status(c, tid, TERMINAL, timeout=60) for tid in in_flight]
        assert all(f["status"] in ("completed", "failed") for f in finals), finals
        # And new work runs end to end.
        fresh = c.call_task("demo_sleep", {"ms": 0})["taskId"]
        assert wait_status(c, fresh, TERMINAL, timeout=30)["status"] == "completed"
