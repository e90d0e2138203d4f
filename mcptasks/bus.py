"""Cross-process signalling over the channel layer, and the SSE event store.

Two kinds of traffic:

* **Stream events** (``publish``): a JSON-RPC message meant for exactly one SSE stream of a
  session. It is stored (``StreamEvent``) for replay with ``Last-Event-ID`` and sent to the
  stream's group, which holds at most one live HTTP connection.
* **Signals** (``signal_task``, ``wake_workers``, ``signal_session``): small wake-ups with no
  payload worth storing; receivers re-read the database.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from collections.abc import Sequence
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models import Case, Max, Q, Value, When
from django.utils import timezone

from tenants import conf as kv_conf

from . import conf, layers
from .models import StreamCursor, StreamEvent

logger = logging.getLogger(__name__)

WORKERS_GROUP = "mcpt.workers"


def _safe(key: str) -> str:
    # Group names allow only [A-Za-z0-9._-] and < 100 chars: hash anything client-controlled.
    return hashlib.sha256(key.encode()).hexdigest()[:40]


def stream_group(stream_id: str) -> str:
    """Group of the (single) connection serving ``stream_id``."""
    return f"mcpt.stream.{_safe(stream_id)}"


def task_group(task_id: str) -> str:
    """Group of everyone waiting on a task: result waiters, the worker running it."""
    return f"mcpt.task.{_safe(task_id)}"


def session_group(session_id: str) -> str:
    """Group of every open stream of a session (closed on DELETE)."""
    return f"mcpt.session.{_safe(session_id)}"


def new_stream_id(prefix: str) -> str:
    """A fresh stream id: ``p`` POST, ``r`` tasks/result; GET streams use :func:`get_stream_id`."""
    return prefix + secrets.token_hex(8)


def get_stream_id(session_id: str) -> str:
    """The id of a session's standalone GET stream (stable for the session's life)."""
    return "g" + _safe("get:" + session_id)[:16]


def parse_event_id(event_id: str) -> tuple[str, int] | None:
    """Split an SSE event id into (stream id, sequence); None if malformed.

    Data events are ``<stream>.<seq>``; priming events add ``-<nonce>`` so that every id is
    unique within the session even when a stream is re-opened at the same position.
    """
    stream, _, seq = event_id.rpartition(".")
    seq = seq.split("-", 1)[0]
    if not stream or not seq.isdigit() or len(stream) > 64:
        return None
    return stream, int(seq)


def priming_id(stream_id: str, seq: int) -> str:
    """A unique event id for a priming event positioned after event ``seq`` of the stream."""
    return f"{stream_id}.{seq}-{secrets.token_hex(4)}"


async def group_send(group: str, message: dict[str, Any]) -> bool:
    """Send to a group within ``LAYER_SEND_TIMEOUT_S``; False (and logged) if it could not.

    A lost wake-up is recovered by the receivers' periodic re-reads of the database, so a slow
    or absent Redis never holds up the request or the write that sends it. After a failure,
    sends are skipped for ``REDIS_BREAKER_S`` and every stream of the process falls back to
    reading the database (see :mod:`mcptasks.layers`).
    """
    layer = get_channel_layer()
    if layer is None:
        return False
    if not layers.send_breaker.allow():
        return False
    s = conf.get()
    try:
        await asyncio.wait_for(layer.group_send(group, message), timeout=s.LAYER_SEND_TIMEOUT_S)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        layers.report_failure(exc, open_s=kv_conf.get().REDIS_BREAKER_S)
        return False
    layers.send_breaker.succeeded()
    return True


#: The event loop of this process's server or worker (see :func:`serve_on`).
_loop: asyncio.AbstractEventLoop | None = None
_sending: set[asyncio.Future[Any]] = set()


def serve_on(loop: asyncio.AbstractEventLoop | None) -> None:
    """Send worker wake-ups requested by sync code in this process's threads on ``loop``.

    Set by web processes (``EmbeddedRuntime``): creating a task runs in the database thread
    every request shares, and a wake-up that waited there for Redis would hold up every other
    request's database call behind it (see :func:`wake_workers`). Other signals still wait for
    their send: routing them through the loop too made a task created right after Redis
    restarted never complete in 2 of 6 runs of ``tests/e2e/test_redis_faults.py`` (cause not
    found), so only the wake-up, a pure nudge backed by the workers' poll, is sent this way.
    """
    global _loop
    _loop = loop


def _serving_loop() -> asyncio.AbstractEventLoop | None:
    loop = _loop
    return loop if loop is not None and loop.is_running() and not loop.is_closed() else None


def _spawn(coro: Any) -> None:
    """On the serving loop: run ``coro`` in the background, keeping a reference until it ends."""
    future = asyncio.ensure_future(coro)
    _sending.add(future)
    future.add_done_callback(_sending.discard)


async def flush(*, within_s: float) -> None:
    """Wait (up to ``within_s``) for the sends still in flight on this loop (shutdown)."""
    pending = [f for f in _sending if not f.done()]
    if pending:
        await asyncio.wait(pending, timeout=within_s)


def _layer_send(group: str, message: dict[str, Any]) -> None:
    if get_channel_layer() is None:
        return
    try:
        async_to_sync(group_send)(group, message)
    except Exception:
        # Never fail the write for a lost wake-up (see group_send).
        logger.warning("channel layer send to %s failed", group, exc_info=True)


def _locked_cursor(*, session_id: str, stream_id: str) -> StreamCursor:
    """The stream's cursor row, created if missing, locked until the transaction ends."""
    # A missing cursor starts after the newest stored event, not at 0: cleanup may have
    # removed the cursor of a stream whose session row is gone (tasks enqueued without a
    # client) while its events are still retained.
    cursor, _ = StreamCursor.objects.select_for_update().get_or_create(
        stream_id=stream_id,
        defaults={
            "session_id": session_id,
            # A callable: evaluated only when the row is created (django-stubs do not know it).
            "last_seq": lambda: StreamEvent.objects.filter(stream_id=stream_id).aggregate(m=Max("seq"))["m"] or 0,
        },  # type: ignore[misc]
    )
    return cursor


def _append(*, session_id: str, stream_id: str, data: str) -> StreamEvent:
    """Store ``data`` as the next event of the stream, numbered under the stream's row lock."""
    with transaction.atomic():
        cursor = _locked_cursor(session_id=session_id, stream_id=stream_id)
        cursor.last_seq += 1
        cursor.save(update_fields=["last_seq", "updated_at"])
        event = StreamEvent.objects.create(session_id=session_id, stream_id=stream_id, seq=cursor.last_seq, data=data)
        cap = conf.get().STREAM_MAX_EVENTS
        if cap > 0 and cursor.last_seq > cap:
            # Keep the newest ``cap`` events (one indexed DELETE, under the stream's row lock):
            # however much a tool sends, its stream never holds more.
            StreamEvent.objects.filter(stream_id=stream_id, seq__lte=cursor.last_seq - cap).delete()
        return event


def publish(*, session_id: str, stream_id: str, message: dict[str, Any]) -> str:
    """Store ``message`` as the next event of ``stream_id`` and push it to its connection.

    Returns the SSE event id. Synchronous (database write); call from a thread in async code.
    The push happens after commit, so a connection that sees a gap can always read it back.
    """
    data = json.dumps(message, separators=(",", ":"))
    event = _append(session_id=session_id, stream_id=stream_id, data=data)
    push = {"type": "stream.event", "event_id": event.event_id, "seq": event.seq, "data": data}
    transaction.on_commit(lambda: _layer_send(stream_group(stream_id), push))
    return event.event_id


#: Group sends of one batch in flight at once: a batch of a hundred finishes must not take every
#: pooled layer connection (other sends would wait past their timeout and open the breaker).
BATCH_SEND_CONCURRENCY = 8


def publish_many(
    items: Sequence[tuple[str, str, dict[str, Any]]], *, signals: Sequence[tuple[str, dict[str, Any]]] = ()
) -> list[str]:
    """:func:`publish` for many ``(session_id, stream_id, message)`` at once; their event ids.

    One transaction stores them all: the streams' cursors are locked in key order (concurrent
    publishers never deadlock), advanced by one UPDATE, and the events written by one INSERT.
    Events of one stream keep the order of ``items``. After commit, the pushes and then
    ``signals`` (``(group, message)`` pairs, e.g. task signals) are sent in one hop to the event
    loop, a few at a time, instead of a blocking round trip per message.
    """
    if not items:
        _layer_send_many([], list(signals))
        return []
    datas = [json.dumps(message, separators=(",", ":")) for _s, _st, message in items]
    sessions: dict[str, str] = {}
    for session_id, stream_id, _m in items:
        sessions.setdefault(stream_id, session_id)
    streams = sorted(sessions)
    cap = conf.get().STREAM_MAX_EVENTS
    with transaction.atomic():
        seqs = dict(
            StreamCursor.objects.select_for_update().filter(stream_id__in=streams).order_by("stream_id")
            .values_list("stream_id", "last_seq")
        )
        for stream_id in (s for s in streams if s not in seqs):
            # Rare (a stream's first event, or its cursor removed by cleanup): created as one
            # event's publish creates it, still locked.
            seqs[stream_id] = _locked_cursor(session_id=sessions[stream_id], stream_id=stream_id).last_seq
        events: list[StreamEvent] = []
        ids: list[str] = []
        for (session_id, stream_id, _m), data in zip(items, datas, strict=True):
            seqs[stream_id] += 1
            events.append(StreamEvent(session_id=session_id, stream_id=stream_id, seq=seqs[stream_id], data=data))
            ids.append(f"{stream_id}.{seqs[stream_id]}")
        StreamCursor.objects.filter(stream_id__in=streams).update(
            last_seq=Case(*[When(stream_id=s, then=Value(seqs[s])) for s in streams]), updated_at=timezone.now()
        )
        StreamEvent.objects.bulk_create(events)
        over = [s for s in streams if cap > 0 and seqs[s] > cap]
        if over:
            # As _append: keep the newest ``cap`` events of each stream (one DELETE).
            drop = Q()
            for s in over:
                drop |= Q(stream_id=s, seq__lte=seqs[s] - cap)
            StreamEvent.objects.filter(drop).delete()
        pushes = [
            (stream_group(stream_id), {"type": "stream.event", "event_id": event_id,
                                       "seq": int(event_id.rpartition(".")[2]), "data": data})
            for (_s, stream_id, _m), data, event_id in zip(items, datas, ids, strict=True)
        ]
        transaction.on_commit(lambda: _layer_send_many(pushes, list(signals)))
    return ids


def _layer_send_many(pushes: list[tuple[str, dict[str, Any]]], signals: list[tuple[str, dict[str, Any]]]) -> None:
    """Send stream pushes, then signals, from sync code: one hop to the loop for all of them."""
    if (not pushes and not signals) or get_channel_layer() is None:
        return

    async def send_all() -> None:
        gate = asyncio.Semaphore(BATCH_SEND_CONCURRENCY)

        async def one(group: str, message: dict[str, Any]) -> None:
            async with gate:
                await group_send(group, message)

        # Pushes first: whoever a signal wakes may look for the stored event it announces.
        for batch in (pushes, signals):
            await asyncio.gather(*(one(g, m) for g, m in batch))

    try:
        async_to_sync(send_all)()
    except Exception:
        # Never fail the write for a lost wake-up (see group_send).
        logger.warning("channel layer batch send (%d messages) failed", len(pushes) + len(signals), exc_info=True)


def task_signal(task_id: str, event: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    """The (group, message) that :func:`signal_task` sends, for :func:`publish_many`'s ``signals``."""
    return task_group(task_id), {"type": "task.signal", "task_id": task_id, "event": event, **extra}


def last_seq(stream_id: str) -> int:
    """The sequence number of the newest event of a stream (0 when it has none)."""
    return int(StreamCursor.objects.filter(pk=stream_id).values_list("last_seq", flat=True).first() or 0)


def signal_task(task_id: str, event: str, **extra: Any) -> None:
    """Wake whoever waits on a task (``event``: changed, message, answer, cancel)."""
    _layer_send(*task_signal(task_id, event, **extra))


def wake_workers() -> None:
    """Tell idle workers that a task is waiting to be claimed.

    From a serving process, wake-ups coalesce: the first is sent at once; requests made while
    it is sent, or within ``WAKE_GAP_S`` after it, become one more send at the end of that gap.
    A burst of creations wakes the workers a few times, not once per task (every wake-up makes
    idle workers claim all they can), and a group send costs more than creating the task.
    """
    loop = _serving_loop()
    if loop is None or get_channel_layer() is None:
        _layer_send(WORKERS_GROUP, {"type": "worker.wake"})
        return
    loop.call_soon_threadsafe(_request_wake)


_wake = {"running": False, "again": False}


def _request_wake() -> None:
    # Runs on the serving loop only: no lock needed for _wake.
    if _wake["running"]:
        _wake["again"] = True
        return
    _wake["running"] = True
    _spawn(_send_wakes())


#: The shortest time between two wake-ups sent by one process (see :func:`wake_workers`).
WAKE_GAP_S = 0.02


#: How often an owed wake-up (one Redis did not take) is tried again.
WAKE_RETRY_S = 0.25


async def _send_wakes() -> None:
    loop = asyncio.get_running_loop()
    owed_since: float | None = None
    try:
        while True:
            _wake["again"] = False
            if await group_send(WORKERS_GROUP, {"type": "worker.wake"}):
                owed_since = None
                await asyncio.sleep(WAKE_GAP_S)
                if not _wake["again"]:
                    return
                continue
            # Redis did not take it (failing over, or the breaker is open): the wake-up is owed,
            # not dropped, or the task it announced waits for the workers' poll. Past one poll
            # period the workers have claimed it on their own.
            now = loop.time()
            owed_since = now if owed_since is None else owed_since
            if now - owed_since > conf.get().WORKER_POLL_S:
                return
            await asyncio.sleep(WAKE_RETRY_S)
    finally:
        _wake["running"] = False


def signal_session(session_id: str, event: str) -> None:
    """Tell every stream of a session something (``ended``)."""
    _layer_send(session_group(session_id), {"type": "session.signal", "event": event})


def bind_stream(*, session_id: str, stream_id: str, task_id: str, rpc_id: str | int | None) -> None:
    """Record on the stream's cursor row that it answers ``tasks/result`` ``rpc_id`` for ``task_id``."""
    StreamCursor.objects.update_or_create(
        stream_id=stream_id, defaults={"session_id": session_id, "task_id": task_id, "rpc_id": rpc_id}
    )


def stream_binding(*, session_id: str, stream_id: str) -> dict[str, Any] | None:
    """``{"taskId", "rid"}`` of a tasks/result stream of ``session_id``, or None."""
    row = StreamCursor.objects.filter(stream_id=stream_id, session_id=session_id).values("task_id", "rpc_id").first()
    if row is None or not row["task_id"]:
        return None
    return {"taskId": row["task_id"], "rid": row["rpc_id"]}
