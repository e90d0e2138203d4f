"""Durable execution under load: sync tools never starve lease renewal (issue 11 item 1)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.live_support import wait_status
from tests.support.client import McpClient
from tests.support.requirements import require_multiprocess
from tests.support.servers import FAST_SETTINGS, Proc, Stack, web_and_worker

CONCURRENCY = 8
LEASE_S = float(FAST_SETTINGS["MCPTASKS_WORKER_LEASE_S"])


@pytest.fixture(scope="module")
def web(stack: Stack) -> Iterator[Proc]:
    if not stack.multi_process:
        require_multiprocess()
    # One tenant fills the whole worker here: no slot kept for other tenants.
    with web_and_worker(stack, concurrency=CONCURRENCY, env={"MCPTASKS_WORKER_TENANT_RESERVED_SLOTS": "0"}) as proc:
        yield proc


def test_a_full_worker_of_sync_tools_keeps_every_lease(web: Proc) -> None:
    """concurrency x sync tools running for 3x the lease: none lost, none re-run."""
    with McpClient(web.url) as c:
        c.initialize()
        ms = int(LEASE_S * 3 * 1000)
        sync_ids = [c.call_task("demo_sync_sleep", {"ms": ms})["taskId"] for _ in range(CONCURRENCY)]
        finals = [wait_status(c, tid, {"completed", "failed", "cancelled"}, timeout=60) for tid in sync_ids]
    assert [t["status"] for t in finals] == ["completed"] * CONCURRENCY, [t.get("statusMessage") for t in finals]


@pytest.mark.parametrize("kind", ["nul", "object", "huge"])
def test_an_unstorable_result_fails_the_task_at_once(web: Proc, kind: str) -> None:
    """Issue 11 item 4: no wedged task, no retry of a retryable tool, a clear message."""
    import time

    with McpClient(web.url) as c:
        c.initialize()
        t0 = time.monotonic()
        tid = c.call_task("test_unstorable", {"kind": kind})["taskId"]
        final = wait_status(c, tid, {"completed", "failed", "cancelled"}, timeout=30)
        took = time.monotonic() - t0
        assert final["status"] == "failed", final
        assert "cannot be stored" in final.get("statusMessage", ""), final
        assert took < LEASE_S, f"took {took:.1f} s: waited for the lease instead of failing at once"
        err = c.request("tasks/result", {"taskId": tid}).message
        assert err is not None and err["error"]["code"] == -32603, err


def test_tools_know_their_tenant_and_principal(web: Proc, stack: Stack) -> None:
    """Issue 11 item 6: ToolContext.tenant / .principal are set in the worker."""
    token = stack.token("whoco", "robot")
    with McpClient(web.url, token=token) as c:
        c.initialize()
        tid = c.call_task("test_whoami", {})["taskId"]
        result = c.request("tasks/result", {"taskId": tid}).result
    assert result["content"][0]["text"].startswith("whoco/")
    assert result["content"][0]["text"] != "whoco/None"


@pytest.fixture(scope="module")
def short_retention(stack: Stack) -> Iterator[Proc]:
    if not stack.multi_process:
        require_multiprocess()
    env = {"MCPTASKS_SSE_RETENTION_S": "1", "MCPTASKS_CLEANUP_INTERVAL_S": "0.5", "MCPTASKS_SSE_MAX_STREAM_S": "2",
           "MCPTASKS_SSE_KEEPALIVE_S": "0.5"}
    with web_and_worker(stack, env=env, concurrency=2) as proc:
        yield proc


def test_tasks_result_resumes_long_after_event_retention(short_retention: Proc) -> None:
    """Issue 11 item 2: a task outliving retention several times over still delivers its result."""
    import time

    with McpClient(short_retention.url) as c:
        c.initialize()
        tid = c.call_task("demo_sleep", {"ms": 8000})["taskId"]
        reply = c.request("tasks/result", {"taskId": tid})
        resumes = 0
        deadline = time.monotonic() + 40
        while reply.message is None and time.monotonic() < deadline:
            ids = [e.id for e in reply.events if e.id]
            assert ids, "the stream gave no event id to resume from"
            time.sleep(0.3)
            reply = c.resume(ids[-1], method="tasks/result")
            assert reply.status == 200, reply.body
            resumes += 1
    assert resumes >= 3, "the connection was expected to be cut several times"
    assert reply.result["content"] == [{"type": "text", "text": "Slept for 8000 ms"}]
