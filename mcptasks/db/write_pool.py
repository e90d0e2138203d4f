"""Request-path writes from async code, side by side instead of one at a time.

Every ORM call from async code (``database_sync_to_async``) runs on one thread per process, so
that code relying on thread-local state stays on one thread. A task creation is a transaction
of several round trips to PostgreSQL; queued on that thread, creations cannot overlap and a
web process creates no faster than one transaction's latency allows. The service functions
called here hold no thread-local state beyond their database connection and run each in a
transaction of its own, so they run on a small pool of threads instead (``WRITE_THREADS``),
each thread with its own persistent connection, health-checked before and after each call as
Channels does.

Only for writes whose caller answers after the commit (a CreateTaskResult, a session id, a
cancelled task): a plain call's row is created after its stream's priming event is out, and a
``notifications/cancelled`` sent on seeing that event must find it, so it keeps the shared
thread's order (see ``handlers.tools_call``).

A write waits for a free thread at most ``WRITE_QUEUE_TIMEOUT_S``: past it, it is dropped
before it starts and the caller answers 503 with ``Retry-After`` (:class:`WriteQueueTimeout`).
Threads held by writes stuck on a lock (up to ``DB_LOCK_TIMEOUT_MS``) must not freeze every
other tenant's writes behind them. A write that has started runs to its end (bounded by the
database timeouts), so its outcome is never unknown.

Not on SQLite (one writer at a time; more connections would only contend for its lock), and
not when ``WRITE_THREADS`` is 0 (tests that wrap each test in a transaction turn it off, since
another thread's connection cannot see the test's uncommitted rows).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from channels.db import DatabaseSyncToAsync, database_sync_to_async
from django.conf import settings
from django.db import OperationalError

from mcptasks import conf

T = TypeVar("T")

logger = logging.getLogger(__name__)


class WriteQueueTimeout(OperationalError):
    """No write thread was free within ``WRITE_QUEUE_TIMEOUT_S``; the write was not made.

    An ``OperationalError``: the transport answers it like a database outage (503, retry).
    """

_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None


def _executor() -> ThreadPoolExecutor | None:
    global _pool
    threads = conf.get().WRITE_THREADS
    if threads <= 0 or "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        return None
    with _lock:
        if _pool is None or _pool[0] != threads:
            _pool = (threads, ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mcptasks-write"))
        return _pool[1]


def write_pool() -> ThreadPoolExecutor | None:
    """The write threads (None when writes share the database thread): ``/readyz`` probes through them."""
    return _executor()


async def run(fn: Callable[..., T], /, **kwargs: Any) -> T:
    """``fn(**kwargs)`` on a write thread (or the shared database thread, see the module)."""
    executor = _executor()
    if executor is None:
        return await database_sync_to_async(fn)(**kwargs)
    lock = threading.Lock()
    state = {"started": False, "dropped": False}

    def guarded(**kw: Any) -> T:
        with lock:
            if state["dropped"]:
                raise WriteQueueTimeout("no write thread was free in time")
            state["started"] = True
        return fn(**kw)

    call = asyncio.ensure_future(DatabaseSyncToAsync(guarded, thread_sensitive=False, executor=executor)(**kwargs))
    done, _ = await asyncio.wait({call}, timeout=conf.get().WRITE_QUEUE_TIMEOUT_S)
    if not done:
        with lock:
            state["dropped"] = not state["started"]
        if state["dropped"]:
            # Still queued: it will be skipped when its turn comes (its exception is consumed).
            call.add_done_callback(lambda f: f.cancelled() or f.exception())
            logger.warning("write dropped: no write thread free for %.1f s", conf.get().WRITE_QUEUE_TIMEOUT_S)
            raise WriteQueueTimeout("no write thread was free in time")
    return await call
