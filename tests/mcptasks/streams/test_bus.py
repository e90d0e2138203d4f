"""The stored event stream: numbering survives a cursor that cleanup removed."""

from __future__ import annotations

from typing import Any

import pytest

from mcptasks.models import StreamCursor, StreamEvent
from mcptasks.streams import events, signals
from mcptasks.tasks import cleanup, transitions

pytestmark = pytest.mark.django_db


def test_numbering_continues_after_cleanup_removed_an_orphan_cursor() -> None:
    # Tasks enqueued without a client have a session id with no session row: cleanup treats
    # their stream's cursor as an orphan while the stream's events are still retained.
    stream = events.new_stream_id("p")
    for _ in range(3):
        events.publish(session_id="no-such-session", stream_id=stream, message={"n": 1})
    cleanup.cleanup_expired()
    assert not StreamCursor.objects.filter(pk=stream).exists()
    event_id = events.publish(session_id="no-such-session", stream_id=stream, message={"n": 2})
    assert event_id == f"{stream}.4"
    assert list(StreamEvent.objects.filter(stream_id=stream).order_by("seq").values_list("seq", flat=True)) == [
        1, 2, 3, 4,
    ]


def _sender_spy(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, dict[str, object]]], object]:
    """Record group sends instead of sending; returns (sent, a release event the sends wait on)."""
    import asyncio
    import threading

    sent: list[tuple[str, dict[str, object]]] = []
    release = threading.Event()

    async def fake_group_send(group: str, message: dict[str, object]) -> bool:
        while not release.is_set():
            await asyncio.sleep(0.005)
        sent.append((group, message))
        return True

    monkeypatch.setattr(signals, "group_send", fake_group_send)
    monkeypatch.setattr(signals, "get_channel_layer", lambda: object())
    return sent, release


async def test_wake_ups_from_a_thread_do_not_wait_for_the_channel_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Task creation runs in the database thread every request shares: its wake-up returns at
    once and is sent on the serving loop. Other signals still wait for their send."""
    import asyncio

    sent, release = _sender_spy(monkeypatch)
    signals.serve_on(asyncio.get_running_loop())
    try:
        # Returns although the send cannot finish until released (it would block otherwise).
        await asyncio.wait_for(asyncio.to_thread(signals.wake_workers), timeout=2)
        assert sent == []
        release.set()
        await signals.flush(within_s=2)
        assert sent == [(signals.WORKERS_GROUP, {"type": "worker.wake"})]
        await asyncio.wait_for(asyncio.to_thread(signals.signal_task, "t1", "changed"), timeout=2)
        assert sent[-1] == (signals.task_group("t1"), {"type": "task.signal", "task_id": "t1", "event": "changed"})
    finally:
        signals.serve_on(None)


async def _sender_done() -> None:
    """Wait for this loop's wake-up sender to end: nothing more is sent until the next request."""
    await signals.flush(within_s=5)
    assert not signals._wake["running"], "the wake-up sender is still running"


async def test_a_burst_of_wake_ups_becomes_a_few_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    sent, release = _sender_spy(monkeypatch)
    release.set()
    signals.serve_on(asyncio.get_running_loop())
    try:
        for _ in range(50):
            await asyncio.to_thread(signals.wake_workers)
        # Each request reached the loop before its to_thread call returned (call_soon_threadsafe,
        # in order), so the sender is running: wait for it to end, trailing gap included.
        await _sender_done()
        wakes = [m for g, m in sent if g == signals.WORKERS_GROUP]
        # The first at once, then at most one per gap: far fewer than 50, never zero after the last.
        assert 1 <= len(wakes) < 50
        count = len(wakes)
        await asyncio.to_thread(signals.wake_workers)  # a later request is never lost
        await _sender_done()
        assert len([m for g, m in sent if g == signals.WORKERS_GROUP]) == count + 1
    finally:
        signals.serve_on(None)


async def test_a_wake_up_skipped_by_an_open_breaker_is_sent_once_redis_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wake-up that could not be sent (Redis failing over: the breaker is open, or the send
    failed) is owed, not dropped: the task it announced would otherwise wait for the workers'
    poll (found by the Sentinel failover test: a 6 s wake-up after the failover)."""
    import asyncio

    sent: list[str] = []
    answers = iter([False, False])  # the breaker is open twice, then Redis takes the send

    async def flaky_group_send(group: str, message: dict[str, object]) -> bool:
        ok = next(answers, True)
        if ok:
            sent.append(group)
        return ok

    monkeypatch.setattr(signals, "group_send", flaky_group_send)
    monkeypatch.setattr(signals, "get_channel_layer", lambda: object())
    monkeypatch.setattr(signals, "WAKE_RETRY_S", 0.01, raising=False)
    signals.serve_on(asyncio.get_running_loop())
    try:
        await asyncio.to_thread(signals.wake_workers)
        for _ in range(200):
            if sent:
                break
            await asyncio.sleep(0.01)
        assert sent == [signals.WORKERS_GROUP]
        await signals.flush(within_s=2)
    finally:
        signals.serve_on(None)
def _layer_spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, object]]]:
    """Record group sends (sent at once) instead of sending them."""
    sent: list[tuple[str, dict[str, object]]] = []

    async def fake_group_send(group: str, message: dict[str, object]) -> bool:
        sent.append((group, message))
        return True

    monkeypatch.setattr(signals, "group_send", fake_group_send)
    monkeypatch.setattr(signals, "get_channel_layer", lambda: object())
    return sent


@pytest.mark.django_db(transaction=True)
def test_publish_many_numbers_each_stream_like_one_publish_at_a_time(monkeypatch: pytest.MonkeyPatch,
                                                                     settings: Any) -> None:
    """One transaction for a batch: per stream, numbers continue the cursor in the batch's order,
    a stream without a cursor continues after its retained events, the retention cap holds, and
    the pushes (then the signals) are sent only after commit."""
    from django.db import transaction

    sent = _layer_spy(monkeypatch)
    a, b, orphan = "pA", "pB", "pORPHAN"
    events.publish(session_id="s1", stream_id=a, message={"n": 0})
    for i in range(3):  # events whose cursor cleanup removed (as in the test above)
        events.publish(session_id="gone-session", stream_id=orphan, message={"old": i})
    StreamCursor.objects.filter(pk=orphan).delete()
    sent.clear()
    settings.MCPTASKS = {**settings.MCPTASKS, "STREAM_MAX_EVENTS": 4}
    items = [("s1", a, {"n": 1}), ("s2", b, {"n": 1}), ("s1", a, {"n": 2}), ("gone-session", orphan, {"new": 1}),
             ("s1", a, {"n": 3}), ("s1", a, {"n": 4})]
    with transaction.atomic():
        ids = events.publish_many(items, signals=[signals.task_signal("t1", "changed", status="completed")])
        assert sent == []  # nothing before commit
    assert ids == [f"{a}.2", f"{b}.1", f"{a}.3", f"{orphan}.4", f"{a}.4", f"{a}.5"]
    rows = {s: list(StreamEvent.objects.filter(stream_id=s).order_by("seq").values_list("seq", "data"))
            for s in (a, b, orphan)}
    # Stream a had 5 events; the cap keeps the newest 4, in the batch's order.
    assert rows[a] == [(2, '{"n":1}'), (3, '{"n":2}'), (4, '{"n":3}'), (5, '{"n":4}')]
    assert rows[b] == [(1, '{"n":1}')]
    assert [seq for seq, _d in rows[orphan]] == [1, 2, 3, 4]
    assert dict(StreamCursor.objects.filter(pk__in=[a, b, orphan]).values_list("pk", "last_seq")) == {
        a: 5, b: 1, orphan: 4}
    # Every event pushed to its stream's group, then the signal.
    assert [(g, m["event_id"]) for g, m in sent[:-1]] == [(signals.stream_group(s), i) for (_x, s, _m), i in
                                                         zip(items, ids, strict=True)]
    assert sent[-1] == (signals.task_group("t1"), {"type": "task.signal", "task_id": "t1", "event": "changed",
                                               "status": "completed"})
    # Rolled back: nothing stored, nothing sent.
    sent.clear()
    with pytest.raises(RuntimeError), transaction.atomic():
        events.publish_many([("s2", b, {"n": 2})])
        raise RuntimeError("rolled back")
    assert sent == [] and StreamEvent.objects.filter(stream_id=b).count() == 1
    assert events.publish(session_id="s2", stream_id=b, message={"n": 2}) == f"{b}.2"


@pytest.mark.django_db(transaction=True)
def test_a_batch_of_finishes_notifies_and_signals_every_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """finish_runs stores each finished task's status notification on its stream (its open
    tasks/result stream, else the session's GET stream if it was ever opened) and signals each
    task, once."""
    import json

    from mcptasks.models import Outcome, Task
    from tests.support.factories import make_auth, make_session, make_task

    sent = _layer_spy(monkeypatch)
    auth = make_auth()
    s1, s2, s3 = make_session(auth), make_session(auth), make_session(auth)
    for opened in (s1, s2):
        events.open_get_stream(session_id=opened.pk)
    tasks = [make_task(auth, s1), make_task(auth, s1), make_task(auth, s2), make_task(auth), make_task(auth, s3)]
    Task.objects.filter(pk=tasks[1].pk).update(stream_id="rSTREAM1")  # a tasks/result stream is open
    Task.objects.filter(pk=tasks[3].pk).update(session_id="")  # enqueued without a client
    tasks[3].session_id = ""
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(attempt=1)
    runs = [(t, Outcome(pk=t.pk, attempt=1, status="completed", result={"content": []})) for t in tasks]
    sent.clear()
    assert transitions.finish_runs(runs=runs) == [True] * 5
    expected = {tasks[0].task_id: events.get_stream_id(tasks[0].session_id), tasks[1].task_id: "rSTREAM1",
                tasks[2].task_id: events.get_stream_id(tasks[2].session_id)}
    got = {}
    for ev in StreamEvent.objects.filter(stream_id__in=set(expected.values())):
        msg = json.loads(ev.data)
        assert msg["method"] == "notifications/tasks/status" and msg["params"]["status"] == "completed"
        got[msg["params"]["taskId"]] = ev.stream_id
    # The task without a session has nobody to notify, nor has the one whose session never
    # opened its GET stream: nothing stored for it, nothing pushed, but its task is signalled.
    assert got == expected
    assert not StreamEvent.objects.filter(stream_id=events.get_stream_id(s3.pk)).exists()
    signalled = sorted(m["task_id"] for g, m in sent if m["type"] == "task.signal")
    assert signalled == sorted(t.task_id for t in tasks)
    pushed = sorted(g for g, m in sent if m["type"] == "stream.event")
    assert pushed == sorted(signals.stream_group(s) for s in expected.values())


@pytest.mark.django_db(transaction=True)
def test_a_get_stream_stores_messages_only_once_it_was_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before its first GET no client can hold an event id of the session's GET stream (a fresh
    GET starts at the end): messages for it are neither stored nor pushed. Once opened, they
    are, numbered from 1, for as long as the session lives (a closed GET resumes)."""
    sent = _layer_spy(monkeypatch)
    stream = events.get_stream_id("s-get")
    assert events.publish(session_id="s-get", stream_id=stream, message={"n": 0}) is None
    assert events.publish_many([("s-get", stream, {"n": 0}), ("s-get", "pX", {"n": 0})]) == ["pX.1"]
    assert not StreamEvent.objects.filter(stream_id=stream).exists()
    assert not StreamCursor.objects.filter(pk=stream).exists()
    assert [g for g, _m in sent] == [signals.stream_group("pX")]
    assert events.open_get_stream(session_id="s-get") == 0
    assert events.publish(session_id="s-get", stream_id=stream, message={"n": 1}) == f"{stream}.1"
    assert events.publish_many([("s-get", stream, {"n": 2})]) == [f"{stream}.2"]
    assert events.open_get_stream(session_id="s-get") == 2  # opened again: starts at the end
