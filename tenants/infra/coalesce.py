"""Coalescing of concurrent calls into one batch (the DataLoader pattern, or group commit).

Under load many requests on one event loop wait for the same kind of round trip at once (the
rate-limit count in Redis, the session-and-task read in PostgreSQL). Each alone costs more in
client code (packing, pool checkout, parsing, the event loop's bookkeeping) and in the server
than the work it asks for. A :class:`Coalescer` runs one batch at a time per event loop: calls
that arrive while a batch is in flight wait for the next one, which then carries all of them in
a single round trip. An idle process pays one extra task switch per call; no call ever waits
for a timer, and every call still reads after it was made (a batch starts only after each of
its calls was submitted), so a client's read never predates its own write.

This module is generic; it lives in ``tenants`` because ``tenants`` may not import ``mcptasks``
and both use it.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _LoopState(Generic[T, R]):
    __slots__ = ("draining", "pending")

    def __init__(self) -> None:
        self.pending: list[tuple[T, asyncio.Future[R]]] = []
        # The running drain task (a reference keeps it from being garbage-collected), or None.
        self.draining: asyncio.Task[None] | None = None


class Coalescer(Generic[T, R]):
    """Batches concurrent :meth:`call`\\ s of one kind per event loop.

    ``run`` takes the batch's items and returns one result per item, in order. If it raises,
    every call in that batch raises the same exception (callers keep their own fallback).
    ``max_batch`` bounds one batch (the statement and the reply stay small).
    """

    def __init__(self, run: Callable[[Sequence[T]], Awaitable[Sequence[R]]], *, max_batch: int = 64) -> None:
        self._run = run
        self._max_batch = max_batch
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState[T, R]] = (
            weakref.WeakKeyDictionary()
        )

    async def call(self, item: T) -> R:
        """``item``'s result, computed in the next batch of this event loop."""
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            state = self._states[loop] = _LoopState()
        fut: asyncio.Future[R] = loop.create_future()
        state.pending.append((item, fut))
        if state.draining is None:
            state.draining = loop.create_task(self._drain(state))
        return await fut

    async def _drain(self, state: _LoopState[T, R]) -> None:
        try:
            while state.pending:
                batch = state.pending[: self._max_batch]
                del state.pending[: self._max_batch]
                # A caller that gave up (cancelled) is left out; its batch may be empty.
                batch = [(item, fut) for item, fut in batch if not fut.done()]
                if not batch:
                    continue
                try:
                    results = await self._run([item for item, _ in batch])
                    if len(results) != len(batch):
                        raise RuntimeError(f"batch of {len(batch)} got {len(results)} results")
                except Exception as exc:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                except BaseException:
                    for _, fut in batch:
                        fut.cancel()
                    raise  # cancellation/shutdown: the rest are failed below
                for (_, fut), result in zip(batch, results, strict=True):
                    if not fut.done():
                        fut.set_result(result)
        finally:
            state.draining = None
            leftover, state.pending = state.pending, []
            for _, fut in leftover:
                if not fut.done():
                    fut.set_exception(RuntimeError("the batch runner stopped"))


K = TypeVar("K")


#: A cached verdict is re-read ahead of its lapse once this share of its time to live is left.
REFRESH_AHEAD = 0.25


def refresh_due(*, left_s: float, ttl_s: float) -> bool:
    """Whether a cached value with ``left_s`` of its ``ttl_s`` left is due to be read again in
    the background (:meth:`SingleFlight.start`) while callers go on with it: when it lapsed
    instead, every request in flight that needed it waited for the one that read it again."""
    return left_s < ttl_s * REFRESH_AHEAD


class SingleFlight(Generic[K, R]):
    """Concurrent calls for the same key share one run, per event loop (no result is kept after).

    When a cached verdict lapses (a verified token, a tenant's limits), every request in flight
    misses at once; without this each would queue its own database hop behind the others'.
    ``key`` must not be a raw client string (use a digest). A caller that is cancelled does not
    cancel the shared run; an exception reaches every caller.
    """

    def __init__(self) -> None:
        self._flights: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[K, asyncio.Task[R]]] = (
            weakref.WeakKeyDictionary()
        )

    async def run(self, key: K, fn: Callable[[], Awaitable[R]]) -> R:
        """``await fn()``, or the result of the run already under way for ``key``."""
        return await asyncio.shield(self.start(key, fn))

    def start(self, key: K, fn: Callable[[], Awaitable[R]]) -> asyncio.Task[R]:
        """The run for ``key``, started now if none is under way; a caller may leave it running
        unawaited (a refresh in the background): its exception is retrieved, never raised."""
        loop = asyncio.get_running_loop()
        flights = self._flights.get(loop)
        if flights is None:
            flights = self._flights[loop] = {}
        flight = flights.get(key)
        if flight is None:
            flight = flights[key] = loop.create_task(_awaited(fn))
            flight.add_done_callback(lambda done: _landed(flights, key, done))
        return flight


async def _awaited(fn: Callable[[], Awaitable[R]]) -> R:
    return await fn()


def _landed(flights: dict[Any, Any], key: Any, done: asyncio.Task[Any]) -> None:
    if flights.get(key) is done:
        del flights[key]
    if not done.cancelled():
        done.exception()  # retrieved: no "never retrieved" warning when every caller left
