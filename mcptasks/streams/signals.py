"""Cross-process signals over the channel layer: group sends, worker wake-ups, task and session
signals.

Signals (``signal_task``, ``wake_workers``, ``signal_session``) are small wake-ups with no
payload worth storing; receivers re-read the database. A lost one is recovered by those
re-reads, so a send never fails the write that makes it. The SSE event store, whose pushes
travel the same way, is :mod:`mcptasks.streams.events`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from mcptasks import conf
from mcptasks.streams import layers
from tenants import conf as kv_conf

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: Group of every idle worker (see :func:`wake_workers`).
WORKERS_GROUP = "mcpt.workers"


def hashed(key: str) -> str:
    """A short hash of ``key`` that is safe in a group name or a stream id."""
    # Group names allow only [A-Za-z0-9._-] and < 100 chars: hash anything client-controlled.
    return hashlib.sha256(key.encode()).hexdigest()[:40]


def stream_group(stream_id: str) -> str:
    """Group of the (single) connection serving ``stream_id``."""
    return f"mcpt.stream.{hashed(stream_id)}"


def task_group(task_id: str) -> str:
    """Group of everyone waiting on a task: result waiters, the worker running it."""
    return f"mcpt.task.{hashed(task_id)}"


def worker_group(worker_id: str) -> str:
    """Group of one worker: the signals of the runs it holds (cancel, answer) reach it here.

    A worker joins it once, instead of joining and leaving a group per run (three Redis round
    trips per task); whoever signals a run names the worker the task's row says holds it.
    """
    return f"mcpt.worker.{hashed(worker_id)}"


def session_group(session_id: str) -> str:
    """Group of every open stream of a session (closed on DELETE)."""
    return f"mcpt.session.{hashed(session_id)}"


async def group_send(group: str, message: dict[str, Any]) -> bool:
    """Send to a group within ``LAYER_SEND_TIMEOUT_S``; False (and logged) if it could not.

    A lost wake-up is recovered by the receivers' periodic re-reads of the database, so a slow
    or absent Redis never holds up the request or the write that sends it. After a failure,
    sends are skipped for ``REDIS_BREAKER_S`` and every stream of the process falls back to
    reading the database (see :mod:`mcptasks.streams.layers`).
    """
    layer = get_channel_layer()
    if layer is None:
        return False
    sent, _ = await _bounded(lambda: layer.group_send(group, message))
    if sent:
        layers.send_breaker.succeeded()
    return sent


async def _bounded(call: Callable[[], Awaitable[T]]) -> tuple[bool, T | None]:
    """``call()`` on the channel layer within ``LAYER_SEND_TIMEOUT_S``, unless the send breaker
    is open: (whether it completed, its value). A failure is reported, opening the breaker."""
    if not layers.send_breaker.allow():
        return False, None
    try:
        value = await asyncio.wait_for(call(), timeout=conf.get().LAYER_SEND_TIMEOUT_S)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        layers.report_failure(exc, open_s=kv_conf.get().REDIS_BREAKER_S)
        return False, None
    return True, value


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


def send(group: str, message: dict[str, Any]) -> None:
    """Send from sync code, waiting for it; a failure is logged, never raised (see :func:`group_send`)."""
    if get_channel_layer() is None:
        return
    try:
        async_to_sync(group_send)(group, message)
    except Exception:
        # Never fail the write for a lost wake-up (see group_send).
        logger.warning("channel layer send to %s failed", group, exc_info=True)


#: Group sends of one batch in flight at once: a batch of a hundred finishes must not take every
#: pooled layer connection (other sends would wait past their timeout and open the breaker).
BATCH_SEND_CONCURRENCY = 8


def send_many(pushes: list[tuple[str, dict[str, Any]]], signals: list[tuple[str, dict[str, Any]]]) -> None:
    """Send stream pushes, then signals, from sync code: one hop to the loop for all of them."""
    if (not pushes and not signals) or get_channel_layer() is None:
        return

    async def send_all() -> None:
        nonlocal pushes, signals
        gate = asyncio.Semaphore(BATCH_SEND_CONCURRENCY)
        live = await _groups_with_members([g for g, _m in (*pushes, *signals)])
        if live is not None:
            # Usually nobody listens (clients poll): one round trip instead of two per empty group.
            pushes = [(g, m) for g, m in pushes if g in live]
            signals = [(g, m) for g, m in signals if g in live]

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


async def _groups_with_members(groups: list[str]) -> set[str] | None:
    """Which of ``groups`` have members (None: unknown, send to all), bounded like a send."""
    layer = get_channel_layer()
    check = getattr(layer, "groups_with_members", None)
    if check is None or len(groups) < 2:
        return None
    done, found = await _bounded(lambda: check(groups))
    return set(found) if done and found is not None else None


def task_signal(task_id: str, event: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    """The (group, message) that :func:`signal_task` sends, for the ``signals`` of
    :func:`mcptasks.streams.events.publish_many`."""
    return task_group(task_id), {"type": "task.signal", "task_id": task_id, "event": event, **extra}


def signal_task(task_id: str, event: str, *, worker_id: str | None = None, **extra: Any) -> None:
    """Wake whoever waits on a task (``event``: changed, message, answer, cancel), and the
    worker running it when ``worker_id`` names one (the task row's ``worker_id``).

    A run is stopped or resumed without the signal too (its lease renewal reads the cancel
    flag, a request waiting for its answer polls): a stale ``worker_id`` only costs latency.
    """
    group, message = task_signal(task_id, event, **extra)
    if worker_id:
        send_many([], [(group, message), (worker_group(worker_id), message)])  # one hop to the loop
    else:
        send(group, message)


def wake_workers() -> None:
    """Tell idle workers that a task is waiting to be claimed.

    From a serving process, wake-ups coalesce: the first is sent at once; requests made while
    it is sent, or within ``WAKE_GAP_S`` after it, become one more send at the end of that gap.
    A burst of creations wakes the workers a few times, not once per task (every wake-up makes
    idle workers claim all they can), and a group send costs more than creating the task.
    """
    loop = _serving_loop()
    if loop is None or get_channel_layer() is None:
        send(WORKERS_GROUP, {"type": "worker.wake"})
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
    send(session_group(session_id), {"type": "session.signal", "event": event})
