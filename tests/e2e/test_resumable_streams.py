"""Resumable SSE: event ids name their stream; Last-Event-ID replays exactly what it missed.

The servers here close every SSE connection after ``MCPTASKS_SSE_MAX_STREAM_S=2`` seconds
(after a ``retry:`` hint), so every flow also proves that a client that reconnects with
``Last-Event-ID`` loses nothing. On PostgreSQL + Redis the reconnects go to the other daphne.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.live_support import Pair, is_terminal_note, status_notes, twin
from tests.support.client import McpClient, SseEvent
from tests.support.requirements import require_multiprocess
from tests.support.servers import Stack

MAX_STREAM_S = 2.0
ENV = {"MCPTASKS_SSE_MAX_STREAM_S": str(MAX_STREAM_S), "MCPTASKS_SSE_KEEPALIVE_S": "0.25"}


PAIR_ENV = ENV  # read by the shared ``pair`` fixture


@pytest.fixture
def client(pair: Pair) -> Iterator[McpClient]:
    with McpClient(pair.a.url) as c:
        c.initialize()
        yield c


def read_get_stream(
    client: McpClient, urls: list[str], until: Callable[[SseEvent], bool], *, last_event_id: str | None = None,
    drop_after: int | None = None, max_connections: int = 20,
) -> tuple[list[SseEvent], int]:
    """Read the GET stream like a client: reconnect with Last-Event-ID whenever it ends.

    Connections alternate between ``urls``. ``drop_after``: the client itself drops the first
    connection after that many messages. Returns the events (priming ones excluded) and the
    number of connections used.
    """
    events: list[SseEvent] = []
    state = {"stop": False, "count": 0}

    def on_event(ev: SseEvent) -> bool:
        if ev.message is None:
            return False
        events.append(ev)
        state["count"] += 1
        if until(ev):
            state["stop"] = True
            return True
        return drop_after is not None and connections == 1 and state["count"] >= drop_after

    connections = 0
    last = last_event_id
    while not state["stop"]:
        connections += 1
        assert connections <= max_connections, f"never saw the end; got {[e.message for e in events]}"
        c = twin(client, urls[(connections - 1) % len(urls)])
        try:
            reply = c.listen(on_event, last_event_id=last)
            assert reply.status == 200, reply.body
        finally:
            c.close()
        ids = [e.id for e in reply.events if e.id]
        last = ids[-1] if ids else last  # the priming event's id counts too
    return events, connections


def test_get_stream_dropped_mid_task_loses_nothing_across_processes(client: McpClient, pair: Pair) -> None:
    if not pair.multi:
        require_multiprocess()
    _dropped_get_stream(client, [pair.b.url, pair.a.url])


def test_get_stream_dropped_mid_task_loses_nothing_single_process(client: McpClient, pair: Pair) -> None:
    _dropped_get_stream(client, [pair.a.url])


def _dropped_get_stream(client: McpClient, urls: list[str]) -> None:
    # Learn the stream's current position (its priming id) before the task starts.
    start: list[str] = []
    probe = twin(client, urls[0])
    probe.listen(lambda ev: bool(start.append(ev.id or "")) or True)
    probe.close()
    task = client.call_task("demo_progress", {"steps": 8, "interval_ms": 350}, meta={"progressToken": "t"})
    tid = task["taskId"]
    got, connections = read_get_stream(client, urls, is_terminal_note(tid), last_event_id=start[0], drop_after=2)
    assert connections >= 2  # the client's own drop, plus any server-side close after MAX_STREAM_S
    # The reference: the whole stream replayed from the start, in order.
    full, _n = read_get_stream(client, urls[:1], is_terminal_note(tid), last_event_id=start[0])
    assert [e.id for e in got] == [e.id for e in full]
    assert [e.message for e in got] == [e.message for e in full]
    assert len({e.id for e in got}) == len(got)  # nothing twice
    notes = status_notes([e.message for e in got if e.message], tid)
    assert notes == [*[("working", f"step {i} of 8") for i in range(1, 9)], ("completed", "step 8 of 8")]
    progress = [e.message["params"]["progress"] for e in got if e.message and e.message["method"] ==
                "notifications/progress"]
    assert progress == list(range(1, 9))


def test_server_closes_long_tasks_result_stream_and_resume_gets_result(client: McpClient, pair: Pair) -> None:
    task = client.call_task("demo_progress", {"steps": 6, "interval_ms": 500})
    tid = task["taskId"]
    first = client.request("tasks/result", {"taskId": tid})
    assert first.message is None, "the server should have closed the stream after MAX_STREAM_S"
    stream_ids = {e.id.rsplit(".", 1)[0] for e in first.events if e.id}
    assert len(stream_ids) == 1 and next(iter(stream_ids)).startswith("r")
    all_events = [e for e in first.events if e.message is not None]
    last = [e.id for e in first.events if e.id][-1]
    urls = [pair.b.url, pair.a.url]
    reply = first
    for attempt in range(10):
        reply = twin(client, urls[attempt % 2]).resume(last, method="tasks/result")
        all_events += [e for e in reply.events if e.message is not None]
        ids = [e.id for e in reply.events if e.id]
        last = ids[-1] if ids else last
        if reply.message is not None:
            break
    assert reply.message is not None, "the resumed tasks/result stream never delivered the result"
    assert reply.result["content"] == [{"type": "text", "text": "Completed 6 steps"}]
    # Everything on the one r-stream, each once and in order; notifications went there too.
    assert {e.id.rsplit(".", 1)[0] for e in all_events if e.id} == stream_ids
    seqs = [int(e.id.rsplit(".", 1)[1]) for e in all_events if e.id]
    assert seqs == sorted(set(seqs))
    notes = status_notes([e.message for e in all_events if e.message], tid)
    assert notes[-1][0] == "completed"
    assert len(notes) == len(set(notes))


def test_resumed_tasks_result_still_delivers_elicitation(client: McpClient, pair: Pair) -> None:
    task = client.call_task("demo_ask", {"question": "Still there?"})
    answered: list[str] = []

    def answer(req: dict[str, Any]) -> dict[str, Any] | None:
        if answered:
            return None
        answered.append(req["id"])
        return None  # do not answer on the first connection: answer after resuming

    first = client.request("tasks/result", {"taskId": task["taskId"]}, on_request=answer)
    assert first.message is None and len(answered) == 1
    last = [e.id for e in first.events if e.id][-1]
    # Resuming does not send the request again (the client has it); answering completes the task.
    resp = client.respond(answered[0], {"action": "accept", "content": {"answer": "yes"}}, url=pair.b.url)
    assert resp.status_code == 202
    reply = twin(client, pair.b.url).resume(last, method="tasks/result")
    for _ in range(5):
        if reply.message is not None:
            break
        last = [e.id for e in reply.events if e.id][-1]
        reply = twin(client, pair.a.url).resume(last, method="tasks/result")
    assert reply.requests == []
    assert reply.result["content"] == [{"type": "text", "text": "yes"}]


def test_replay_is_per_stream_and_per_session(client: McpClient, pair: Pair) -> None:
    task = client.call_task("demo_progress", {"steps": 2, "interval_ms": 300})
    result = client.request("tasks/result", {"taskId": task["taskId"]})
    assert "text/event-stream" in result.content_type  # still running: the result streams
    r_stream = [e.id for e in result.events if e.id][0].rsplit(".", 1)[0]
    # Replaying the r-stream from its start gives only its own events (the response last).
    replay = twin(client, pair.b.url).resume(f"{r_stream}.0", method="tasks/result")
    assert {e.id.rsplit(".", 1)[0] for e in replay.events if e.id} == {r_stream}
    assert replay.message == result.message
    # Another session cannot resume this session's stream.
    with McpClient(pair.b.url) as other:
        other.initialize()
        h = other.headers(**{"Accept": "text/event-stream", "Last-Event-ID": f"{r_stream}.0"})
        h.pop("Content-Type")
        assert other.http.get(other.url, headers=h).status_code == 404
        bad = other.http.get(other.url, headers={**h, "Last-Event-ID": "not-an-id"})
        assert bad.status_code == 400


def test_cleanup_drops_events_past_retention(client: McpClient, pair: Pair, stack: Stack) -> None:
    start: list[str] = []
    probe = twin(client, pair.a.url)
    probe.listen(lambda ev: bool(start.append(ev.id or "")) or True)
    probe.close()
    old = client.call_task("demo_progress", {"steps": 1, "interval_ms": 10})
    events, _n = read_get_stream(client, [pair.a.url], is_terminal_note(old["taskId"]), last_event_id=start[0])
    assert status_notes([e.message for e in events if e.message], old["taskId"])
    stack.manage("mcptasks_cleanup", extra_env={"MCPTASKS_SSE_RETENTION_S": "0"})
    # The stored events are gone: a replay from the same position shows only newer ones.
    sentinel = client.call_task("demo_progress", {"steps": 1, "interval_ms": 10})
    after, _n = read_get_stream(client, [pair.a.url], is_terminal_note(sentinel["taskId"]), last_event_id=start[0])
    assert status_notes([e.message for e in after if e.message], old["taskId"]) == []
    assert status_notes([e.message for e in after if e.message], sentinel["taskId"])[-1][0] == "completed"
