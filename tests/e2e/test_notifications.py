"""notifications/tasks/status and progress: on exactly one stream of the requestor's session.

On PostgreSQL + Redis the deployment is two daphne processes and two workers: the task is
created through A, the GET stream is read through B, and the tool runs in either worker, so
every notification crosses processes through channels-redis. On SQLite the same flows run
in one daphne with its embedded worker and the in-memory layer.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.live_support import (
    RELATED,
    Listener,
    Pair,
    is_terminal_note,
    status_notes,
    twin,
    wait_status,
)
from tests.support.client import McpClient
from tests.support.requirements import require_multiprocess

STEPS = [("working", f"step {i} of 3") for i in (1, 2, 3)]


@pytest.fixture
def client(pair: Pair) -> Iterator[McpClient]:
    with McpClient(pair.a.url) as c:
        c.initialize()
        yield c


def _listen(client: McpClient, url: str, **kw: object) -> Listener:
    listener = Listener(twin(client, url), **kw).start()  # type: ignore[arg-type]
    listener.wait_primed()
    return listener


def test_status_and_progress_arrive_in_order_on_get_stream_of_other_process(client: McpClient, pair: Pair) -> None:
    if not pair.multi:
        require_multiprocess()
    listener = _listen(client, pair.b.url)
    task = client.call_task("demo_progress", {"steps": 3, "interval_ms": 100}, meta={"progressToken": "p-1"})
    listener.until = is_terminal_note(task["taskId"])
    listener.wait_done()
    _assert_progress_flow(listener, task["taskId"], "p-1")


def test_status_and_progress_in_order_single_process(client: McpClient, pair: Pair) -> None:
    listener = _listen(client, pair.a.url)
    task = client.call_task("demo_progress", {"steps": 3, "interval_ms": 100}, meta={"progressToken": "p-2"})
    listener.until = is_terminal_note(task["taskId"])
    listener.wait_done()
    _assert_progress_flow(listener, task["taskId"], "p-2")


def _assert_progress_flow(listener: Listener, task_id: str, token: str) -> None:
    notes = status_notes(listener.messages, task_id)
    # Each change once, in order: three statusMessage changes, then completed.
    assert notes == [*STEPS, ("completed", "step 3 of 3")], notes
    final = [m for m in listener.messages if m.get("method") == "notifications/tasks/status"][-1]["params"]
    assert final["taskId"] == task_id and "_meta" not in final  # the full Task, no related-task _meta
    assert {"createdAt", "lastUpdatedAt", "ttl"} <= set(final)
    progress = [m["params"] for m in listener.messages if m.get("method") == "notifications/progress"]
    assert [p["progress"] for p in progress] == [1, 2, 3]
    assert all(p["progressToken"] == token and p["total"] == 3 for p in progress)
    assert all(p["_meta"][RELATED] == {"taskId": task_id} for p in progress)
    # Event ids name the GET stream and grow.
    ids = [e.id for e in listener.events if e.id]
    stream = ids[0].rsplit(".", 1)[0]
    assert stream.startswith("g") and all(i.rsplit(".", 1)[0] == stream for i in ids)
    # (priming ids carry a nonce after the position; data events are "<stream>.<seq>")
    seqs = [int(e.id.rsplit(".", 1)[1]) for e in listener.events if e.id and e.message is not None]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_open_tasks_result_stream_takes_notifications_never_both(client: McpClient, pair: Pair) -> None:
    listener = _listen(client, pair.b.url)
    task = client.call_task("demo_progress", {"steps": 3, "interval_ms": 150})
    tid = task["taskId"]
    reply = client.request("tasks/result", {"taskId": tid})
    assert reply.result["content"] == [{"type": "text", "text": "Completed 3 steps"}]
    on_result = status_notes(reply.notifications, tid)
    # The terminal notification precedes the response on the tasks/result stream...
    assert on_result and on_result[-1][0] == "completed"
    # ...and the GET stream never carries a notification the tasks/result stream had. A later
    # sentinel task (no tasks/result open: its notifications go to GET) bounds what to read.
    sentinel = client.call_task("demo_progress", {"steps": 1, "interval_ms": 10})
    listener.until = is_terminal_note(sentinel["taskId"])
    listener.wait_done()
    on_get = status_notes(listener.messages, tid)
    assert not set(on_get) & set(on_result), (on_get, on_result)
    assert sorted(on_get + on_result) == sorted([*STEPS, ("completed", "step 3 of 3")])


def test_second_get_takes_over_the_first(client: McpClient, pair: Pair) -> None:
    first = _listen(client, pair.a.url)
    second = _listen(client, pair.b.url)
    first.wait_done(timeout=10)  # closed by the newer connection (with a retry hint)
    assert first.error is None and first.status == 200
    task = client.call_task("demo_progress", {"steps": 1, "interval_ms": 10})
    second.until = is_terminal_note(task["taskId"])
    second.wait_done()
    assert status_notes(second.messages, task["taskId"])[-1][0] == "completed"
    assert status_notes(first.messages, task["taskId"]) == []


def test_delete_session_ends_its_streams(client: McpClient, pair: Pair) -> None:
    listener = _listen(client, pair.b.url)
    resp = client.http.delete(client.url, headers=client.headers())
    assert resp.status_code == 204
    listener.wait_done(timeout=10)
    assert listener.error is None, listener.error
    again = twin(client, pair.b.url)
    h = again.headers(Accept="text/event-stream")
    h.pop("Content-Type")
    assert again.http.get(again.url, headers=h).status_code == 404
    again.close()


def test_disconnected_tasks_result_never_cancels_task(client: McpClient, pair: Pair) -> None:
    task = client.call_task("demo_progress", {"steps": 3, "interval_ms": 150})
    reply = client.request("tasks/result", {"taskId": task["taskId"]}, on_event=lambda ev: True)
    assert reply.message is None  # we dropped the connection right after the priming event
    done = wait_status(client, task["taskId"], {"completed", "failed", "cancelled"})
    assert done["status"] == "completed"
