"""Tasks across processes: two daphne processes (A, B) and one worker on PostgreSQL + Redis.

Nothing about a task may depend on the process that created it: the row is committed before the
CreateTaskResult is sent, the result wait wakes on a channel-layer signal that any process can
receive, and the worker runs the tool wherever it is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.test_tasks_spec import NO_BACKSTOP, in_background, wait_status
from tests.support.client import McpClient, SseEvent
from tests.support.requirements import require_multiprocess
from tests.support.servers import Proc, Stack


@pytest.fixture(scope="module")
def pair(stack: Stack) -> Iterator[tuple[Proc, Proc]]:
    """Daphne A and B (no embedded workers) and one separate worker process."""
    require_multiprocess()
    a = stack.daphne(embedded_worker=False, extra_env=NO_BACKSTOP)
    b = stack.daphne(embedded_worker=False, extra_env=NO_BACKSTOP)
    w = stack.worker(concurrency=4)
    yield a, b
    for p in (a, b, w):
        p.terminate(timeout=10)


@pytest.fixture
def clients(pair: tuple[Proc, Proc]) -> Iterator[tuple[McpClient, McpClient]]:
    """One session, initialized on A; ``b`` is the same session talking to process B."""
    a_proc, b_proc = pair
    with McpClient(a_proc.url) as a, McpClient(b_proc.url) as b:
        a.initialize()
        b.session_id = a.session_id
        b.protocol_version = a.protocol_version
        yield a, b


def test_task_created_on_a_is_immediately_visible_on_b(clients: tuple[McpClient, McpClient]) -> None:
    a, b = clients
    for _ in range(5):
        task = a.call_task("demo_sleep", {"ms": 2000})
        got = b.request("tasks/get", {"taskId": task["taskId"]}).result  # no retry: must be there at once
        assert got["taskId"] == task["taskId"] and got["status"] == "working"
        assert got["createdAt"] == task["createdAt"]
        b.request("tasks/cancel", {"taskId": task["taskId"]})


def test_blocking_tasks_result_on_b_returns_result_of_task_created_on_a(
    clients: tuple[McpClient, McpClient],
) -> None:
    a, b = clients
    task = a.call_task("demo_sleep", {"ms": 1500})
    th, box = in_background(lambda: b.request("tasks/result", {"taskId": task["taskId"]}))
    time.sleep(0.4)
    assert th.is_alive(), "tasks/result on B returned before the task ended"
    assert a.request("tasks/get", {"taskId": task["taskId"]}).result["status"] == "working"
    th.join(20)
    assert "error" not in box, box.get("error")
    result = box["value"].result
    assert result["content"] == [{"type": "text", "text": "Slept for 1500 ms"}]
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}


def test_cancel_on_b_of_task_created_on_a(clients: tuple[McpClient, McpClient]) -> None:
    a, b = clients
    task = a.call_task("demo_sleep", {"ms": 10_000})
    wait_status(a, task["taskId"], "working")
    waiter = McpClient(a.url)
    waiter.session_id, waiter.protocol_version = a.session_id, a.protocol_version
    th, box = in_background(lambda: waiter.request("tasks/result", {"taskId": task["taskId"]}))
    time.sleep(0.3)
    reply = b.request("tasks/cancel", {"taskId": task["taskId"]})
    assert reply.result["status"] == "cancelled"
    assert a.request("tasks/get", {"taskId": task["taskId"]}).result["status"] == "cancelled"
    th.join(10)  # the waiter on A is woken by the cancel made on B
    waiter.close()
    assert not th.is_alive()
    assert box["value"].error["code"] == -32603
    err = a.request("tasks/cancel", {"taskId": task["taskId"]}).error
    assert err == {"code": -32602, "message": "Cannot cancel task: already in terminal status 'cancelled'"}


def test_tasks_result_survives_client_reconnecting(clients: tuple[McpClient, McpClient]) -> None:
    """Drop the first tasks/result connection mid-wait; the task keeps running; ask again (and resume)."""
    a, b = clients
    task = a.call_task("demo_sleep", {"ms": 2500})
    tid = task["taskId"]
    first_events: list[SseEvent] = []

    def drop_after_priming(ev: SseEvent) -> bool:
        first_events.append(ev)
        return True  # returning True closes the connection

    dropped = b.request("tasks/result", {"taskId": tid}, on_event=drop_after_priming)
    assert dropped.message is None  # we hung up before any response
    priming_id = first_events[0].id
    assert priming_id
    time.sleep(0.3)
    # The drop did not cancel the task.
    assert a.request("tasks/get", {"taskId": tid}).result["status"] == "working"
    # Ask again on the other process: blocks and returns the result.
    again = a.request("tasks/result", {"taskId": tid})
    assert again.result["content"] == [{"type": "text", "text": "Slept for 2500 ms"}]
    assert a.request("tasks/get", {"taskId": tid}).result["status"] == "completed"


def test_tasks_result_stream_can_be_resumed_with_last_event_id_on_other_process(
    clients: tuple[McpClient, McpClient],
) -> None:
    a, b = clients
    task = a.call_task("demo_sleep", {"ms": 1500})
    events: list[SseEvent] = []

    def drop(ev: SseEvent) -> bool:
        events.append(ev)
        return True

    b.request("tasks/result", {"taskId": task["taskId"]}, on_event=drop)
    assert events and events[0].id
    resumed = a.resume(events[0].id, method="tasks/result")
    msg: dict[str, Any] | None = resumed.message
    assert msg is not None and "result" in msg, msg
    assert msg["result"]["content"] == [{"type": "text", "text": "Slept for 1500 ms"}]


def test_a_session_ended_on_a_gets_no_task_on_b(clients: tuple[McpClient, McpClient]) -> None:
    """B remembers the session its creations read (issue 27: a creation then skips that read);
    a DELETE of the session on A, which B does not hear of, still refuses B's next creation."""
    a, b = clients
    for _ in range(2):  # B reads the session, then uses what it remembers
        b.call_task("demo_sleep", {"ms": 1})
    ended = a.http.delete(a.url, headers=a.headers())
    assert ended.status_code == 204
    refused = b.http.post(b.url, headers=b.headers(), json={
        "jsonrpc": "2.0", "id": 99, "method": "tools/call",
        "params": {"name": "demo_sleep", "arguments": {"ms": 1}, "task": {"ttl": 60_000}}})
    assert refused.status_code == 404, refused.text
    listed = b.http.post(b.url, headers=b.headers(), json={"jsonrpc": "2.0", "id": 100, "method": "ping"})
    assert listed.status_code == 404
