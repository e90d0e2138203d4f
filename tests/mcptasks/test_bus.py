"""The stored event stream: numbering survives a cursor that cleanup removed."""

from __future__ import annotations

import pytest

from mcptasks import bus, services
from mcptasks.models import StreamCursor, StreamEvent

pytestmark = pytest.mark.django_db


def test_numbering_continues_after_cleanup_removed_an_orphan_cursor() -> None:
    # Tasks enqueued without a client have a session id with no session row: cleanup treats
    # their stream's cursor as an orphan while the stream's events are still retained.
    stream = bus.get_stream_id("no-such-session")
    for _ in range(3):
        bus.publish(session_id="no-such-session", stream_id=stream, message={"n": 1})
    services.cleanup_expired()
    assert not StreamCursor.objects.filter(pk=stream).exists()
    event_id = bus.publish(session_id="no-such-session", stream_id=stream, message={"n": 2})
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

    monkeypatch.setattr(bus, "group_send", fake_group_send)
    monkeypatch.setattr(bus, "get_channel_layer", lambda: object())
    return sent, release


async def test_wake_ups_from_a_thread_do_not_wait_for_the_channel_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Task creation runs in the database thread every request shares: its wake-up returns at
    once and is sent on the serving loop. Other signals still wait for their send."""
    import asyncio

    sent, release = _sender_spy(monkeypatch)
    bus.serve_on(asyncio.get_running_loop())
    try:
        # Returns although the send cannot finish until released (it would block otherwise).
        await asyncio.wait_for(asyncio.to_thread(bus.wake_workers), timeout=2)
        assert sent == []
        release.set()
        await bus.flush(within_s=2)
        assert sent == [(bus.WORKERS_GROUP, {"type": "worker.wake"})]
        await asyncio.wait_for(asyncio.to_thread(bus.signal_task, "t1", "changed"), timeout=2)
        assert sent[-1] == (bus.task_group("t1"), {"type": "task.signal", "task_id": "t1", "event": "changed"})
    finally:
        bus.serve_on(None)


async def test_a_burst_of_wake_ups_becomes_a_few_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    sent, release = _sender_spy(monkeypatch)
    release.set()
    bus.serve_on(asyncio.get_running_loop())
    try:
        for _ in range(50):
            await asyncio.to_thread(bus.wake_workers)
        await asyncio.sleep(bus.WAKE_GAP_S * 3)
        await bus.flush(within_s=2)
        wakes = [m for g, m in sent if g == bus.WORKERS_GROUP]
        # The first at once, then at most one per gap: far fewer than 50, never zero after the last.
        assert 1 <= len(wakes) < 50
        count = len(wakes)
        await asyncio.to_thread(bus.wake_workers)  # a later request is never lost
        await asyncio.sleep(bus.WAKE_GAP_S * 3)
        await bus.flush(within_s=2)
        assert len([m for g, m in sent if g == bus.WORKERS_GROUP]) == count + 1
    finally:
        bus.serve_on(None)


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

    monkeypatch.setattr(bus, "group_send", flaky_group_send)
    monkeypatch.setattr(bus, "get_channel_layer", lambda: object())
    monkeypatch.setattr(bus, "WAKE_RETRY_S", 0.01, raising=False)
    bus.serve_on(asyncio.get_running_loop())
    try:
        await asyncio.to_thread(bus.wake_workers)
        for _ in range(200):
            if sent:
                break
            await asyncio.sleep(0.01)
        assert sent == [bus.WORKERS_GROUP]
        await bus.flush(within_s=2)
    finally:
        bus.serve_on(None)
