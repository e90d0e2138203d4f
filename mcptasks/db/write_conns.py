"""Single-statement writes from async code, on a small pool of async connections.

A task creation made through the ORM is a transaction of several round trips (BEGIN, the task,
its audit event, the quota slot, COMMIT) on a write thread (:mod:`mcptasks.db.write_pool`):
each creation pays a thread hop, a connection health check and the ORM's compilation, and a
limited tenant's row stays locked across the round trips to Python until the COMMIT. Written as
one statement (data-modifying CTEs), a creation is one round trip in autocommit: its locks last
only as long as the statement runs on the server.

The statements run on a :class:`psycopg_pool.AsyncConnectionPool` per event loop of at most
``WRITE_THREADS`` connections, so a statement waiting on a lock (up to ``DB_LOCK_TIMEOUT_MS``)
never holds up the other tenants' writes behind it on one connection; a write that waits longer
than ``WRITE_QUEUE_TIMEOUT_S`` for a connection fails with :class:`WriteQueueTimeout` (503)
before it starts. The connections carry the timeouts as startup options.

Used only where :func:`available` (PostgreSQL without a transaction pooler, ``ASYNC_READS`` on,
``WRITE_THREADS`` > 0 and the async path not failing); callers use the ORM otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from django.db import OperationalError

from mcptasks import conf
from mcptasks.db import async_sql, wakeups
from mcptasks.db.write_pool import WriteQueueTimeout
from tenants.infra.coalesce import Coalescer

logger = logging.getLogger(__name__)

_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
#: The connections each pool opened (a pool refers to its loop, so neither is ever collected).
_opened: dict[int, weakref.WeakSet[Any]] = {}


class Refused(Exception):
    """The database refused the statement (a constraint, bad data): nothing was written."""


def available() -> bool:
    """Whether single-statement writes may be made now (else the caller uses the ORM).

    Not behind a transaction pooler: there the timeouts can only be set inside a transaction,
    and a transaction around the statement is what a host lost before its COMMIT leaves open,
    holding a limited tenant's row until the idle-in-transaction timeout (and the next of that
    host's creations queued behind it then too: tests/e2e/test_reference_deployment.py). In
    autocommit the server ends the statement, and its locks, without the client.
    """
    app = conf.get()
    return app.WRITE_THREADS > 0 and app.DB_POOLER == "none" and async_sql.available()


def _raise_if_cancelled() -> None:
    """Raise the cancellation of the current task that something below swallowed."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class _CancellableQueue:
    """A pool worker's job queue that ends the worker once its task has been cancelled.

    psycopg_pool's maintenance worker catches ``CancelledError`` around each job, and its
    connection attempt does too (logged as ``error connecting in 'mcptasks-writes': `` with no
    text): a cancellation that arrives while the pool connects is swallowed, and the worker waits
    for its next job forever. An event loop that shut down then (a SIGTERM while PostgreSQL was
    being reconnected to, a test's loop closing while its pool still opened) never finished.
    The cancellation is still recorded on the task (``Task.cancelling``): asked for the next job,
    this queue raises it where nothing catches it.
    """

    __slots__ = ("_queue",)

    def __init__(self, queue: Any) -> None:
        self._queue = queue

    async def get(self) -> Any:
        _raise_if_cancelled()
        return await self._queue.get()


class _CancellableEvent(asyncio.Event):
    """The pool scheduler's wake-up event, raising a cancellation its wait swallowed.

    The scheduler waits with ``asyncio.wait_for``, which on Python 3.11 returns normally when the
    event is set in the same pass as the task is cancelled (the retry a swallowed connection
    attempt schedules sets it): the scheduler then waited on, and the loop's shutdown with it.
    """

    async def wait_timeout(self, delay: float) -> bool:
        _raise_if_cancelled()
        try:
            await asyncio.wait_for(self.wait(), delay)
            woken = True
        except TimeoutError:
            woken = False
        _raise_if_cancelled()
        return woken


@functools.cache
def _pool_class() -> type[Any]:
    """psycopg_pool's AsyncConnectionPool whose background tasks end when cancelled (see
    :class:`_CancellableQueue` and :class:`_CancellableEvent`)."""
    from psycopg_pool import AsyncConnectionPool

    class Pool(AsyncConnectionPool):
        def _start_workers(self) -> None:
            # open() has just made the scheduler: nothing waits on its event yet.
            self._sched._event = _CancellableEvent()  # type: ignore[assignment]  # the same interface
            super()._start_workers()

        @classmethod
        async def worker(cls, q: Any) -> None:
            await super().worker(_CancellableQueue(q))  # type: ignore[arg-type]  # only get() is used

    return Pool


async def _pool() -> Any:
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        _drop_pools_of_closed_loops()
        app = conf.get()
        opened: weakref.WeakSet[Any] = weakref.WeakSet()

        async def configure(conn: Any) -> None:
            conn.adapters.register_loader("timestamptz", async_sql.utc_timestamptz_loader())
            opened.add(conn)

        pool = _pool_class()(
            kwargs={**async_sql.conninfo(), "connect_timeout": 5},
            min_size=1,
            max_size=max(1, app.WRITE_THREADS),
            open=False,
            configure=configure,
            timeout=app.WRITE_QUEUE_TIMEOUT_S,
            name="mcptasks-writes",
        )
        _pools[loop] = pool
        _opened[id(pool)] = opened
        await pool.open(wait=False)
    return pool


def _drop_pools_of_closed_loops() -> None:
    """Close the connections of pools whose event loop has closed (a server has one loop for
    its life; tests and ``async_to_sync`` make many). Nothing can await on a closed loop, so the
    sockets are closed directly."""
    for loop, pool in list(_pools.items()):
        if loop.is_closed():
            for conn in list(_opened.pop(id(pool), ())):
                conn.pgconn.finish()
            _pools.pop(loop, None)


async def execute_grouped(sql: str, params: Sequence[Any], *, group: int | str | None,
                          many: Callable[[int], str] | None = None, wakes: str | None = None) -> tuple[Any, ...] | None:
    """:func:`execute`, sharing one transaction with the same ``group``'s concurrent statements.

    Statements of one group that arrive while that group's previous batch is in flight are sent
    together in pipeline mode: one write to the server, one commit (one WAL flush) and, for a
    ``pg_notify`` they all make, one notification. Issue 27 measured the send of each creation as
    the largest single share of a web process's CPU under load.

    ``group`` must name the only row a statement may lock (a counted tenant's creation: its
    tenant), so a batch's transaction holds no lock but that one row and two batches can never
    wait on each other in a cycle; statements that never wait for a lock may share any group (see
    :func:`mcptasks.models.creationsql.insert_task`). The server runs the whole batch without
    waiting for the client (it is sent with its final Sync), so no lock is held across a round
    trip to Python either.

    ``many(n)``, when given, is one statement doing what ``n`` of ``sql`` do, taking their
    parameters one after another and answering one row per statement that would have answered
    one, led by that statement's 1-based place in the batch (the others answer None): a batch
    is then that one statement instead of a pipeline of ``n``.

    ``wakes``: the statements create tasks and end their rows with
    :func:`mcptasks.db.wakeups.notify_sql`, and this is the check statement that reads the
    flags again: each one sent is booked in this loop's :class:`~mcptasks.db.wakeups.WakeLedger`.

    Same results and exceptions as :func:`execute`. A lock or statement timeout fails the whole
    batch alike (nothing of it was written), except that a lock timeout of ``many``'s statement
    runs each statement again alone (the group locks no row, so one caller's wait was not the
    others'); any other refusal rolls the batch back and its statements are run again one by
    one, so each caller gets its own statement's answer.
    """
    batches = _grouped.get((sql, group))
    if batches is None:
        batches = _grouped[(sql, group)] = Coalescer(lambda items: _run_batch(sql, items, many, wakes),
                                                     max_batch=GROUP_MAX)
    outcome = await batches.call(list(params))
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


#: At most this many statements share one transaction.
GROUP_MAX = 32

_grouped: dict[tuple[str, int | str | None], Coalescer[list[Any], Any]] = {}


async def _booked(wakes: str | None, send: Callable[[], Awaitable[list[Any]]]) -> list[Any]:
    """``send()``'s rows; with ``wakes`` (the check statement), booked in this loop's
    :class:`~mcptasks.db.wakeups.WakeLedger` (taking the ticket before anything is sent)."""
    if wakes is None:
        return await send()
    book = wakeups.ledger()
    check = functools.partial(execute, wakes, ())
    ticket = book.sent()
    try:
        rows = await send()
    except (async_sql.Unavailable, asyncio.CancelledError):
        # Sent, perhaps committed, and its answer lost: a debt, paid by a check.
        book.done(ticket, [], check=check, may_have_committed=True)
        raise
    except BaseException:
        book.done(ticket, [], check=check)  # nothing was written
        raise
    book.done(ticket, rows, check=check)
    return rows


async def _run_batch(sql: str, items: Sequence[list[Any]], many: Callable[[int], str] | None = None,
                     wakes: str | None = None) -> list[Any]:
    """One transaction of ``items`` (each the parameters of ``sql``), pipelined or as ``many``'s
    one statement: their first rows."""
    import psycopg

    if len(items) == 1:
        return [await _outcome(sql, items[0], wakes)]
    if many is not None:
        try:
            return await _booked(wakes, lambda: _run_many(many, items))
        except OperationalError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
                raise
        except psycopg.Error:  # refused (_write_connection maps timeouts and failed connections)
            return [await _outcome(sql, params, wakes) for params in items]
        # One row waited past the lock timeout, and the whole statement was rolled back. The
        # statements of a group given ``many`` lock no row of their own group (see
        # :func:`execute_grouped`), so the wait was one caller's: a row another transaction is
        # inserting with the same unique values (a client retrying an idempotency key whose first
        # attempt is still open on a host that vanished). Each alone, concurrently: that caller
        # waits again and fails alone; the other tenants' creations are made.
        return list(await asyncio.gather(*(_outcome(sql, params, wakes) for params in items)))
    rows = await _booked(wakes, lambda: _run_pipelined(sql, items))
    if not rows:  # rolled back as a whole: each statement again, alone
        return [await _outcome(sql, params, wakes) for params in items]
    return rows


async def _run_pipelined(sql: str, items: Sequence[list[Any]]) -> list[Any]:
    """``items`` as statements of one transaction sent in pipeline mode: a row (or None) each,
    or no rows if the server refused one (nothing of the batch was written)."""
    import psycopg
    from psycopg import AsyncRawCursor

    async with _write_connection() as conn:
        cursors = []
        try:
            async with conn.pipeline():
                for params in items:
                    cur = AsyncRawCursor(conn)
                    await cur.execute(sql, params, prepare=True)
                    cursors.append(cur)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            raise  # a timeout or a failed connection: the whole batch, as _write_connection says
        except psycopg.Error:
            return []
        rows = [await cur.fetchone() for cur in cursors]
    return [tuple(row) if row is not None else None for row in rows]


async def _run_many(many: Callable[[int], str], items: Sequence[list[Any]]) -> list[Any]:
    """``items`` as ``many``'s one statement: a row (or None) per item."""
    from psycopg import AsyncRawCursor

    async with _write_connection() as conn:
        cur = AsyncRawCursor(conn)
        await cur.execute(many(len(items)), [p for params in items for p in params], prepare=True)
        answered: list[Any] = [None] * len(items)
        for row in await cur.fetchall():
            answered[row[0] - 1] = tuple(row[1:])
        return answered


async def _outcome(sql: str, params: Sequence[Any], wakes: str | None = None) -> Any:
    """:func:`execute`'s row, or the exception it raised (a batch answers each of its callers)."""
    try:
        return await execute(sql, params, wakes=wakes)
    except Exception as exc:
        return exc


@contextlib.asynccontextmanager
async def _write_connection() -> AsyncIterator[Any]:
    """A connection of this loop's pool, with the failures every write shares mapped:
    :class:`WriteQueueTimeout` when none was free in time (nothing was sent); Django's
    ``OperationalError`` on a lock or statement timeout (rolled back, the connection is fine);
    :class:`async_sql.Unavailable` when the connection failed (what was sent may or may not
    have committed). A refusal of the statement itself passes through as psycopg raised it."""
    import psycopg
    from psycopg_pool import PoolTimeout

    pool = await _pool()
    try:
        async with pool.connection() as conn:
            yield conn
    except PoolTimeout:
        logger.warning("write dropped: no write connection free for %.1f s", conf.get().WRITE_QUEUE_TIMEOUT_S)
        raise WriteQueueTimeout("no write connection was free in time") from None
    except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as exc:
        # Answered like the ORM's (503, retry); the ORM would only wait as long again.
        raise OperationalError(f"the write timed out on the server ({type(exc).__name__})") from exc
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        async_sql.mark_failed()
        logger.warning("async write failed (%s); using the ORM for %.0f s", type(exc).__name__,
                       async_sql.RETRY_AFTER_S)
        raise async_sql.Unavailable from exc


async def execute(sql: str, params: Sequence[Any], *, wakes: str | None = None) -> tuple[Any, ...] | None:
    """Run one statement (``$n`` placeholders) as its own transaction; its first row.
    ``wakes`` as :func:`execute_grouped` takes it.

    :class:`Refused` when the database refuses it (a constraint, bad data: nothing was written);
    otherwise what :func:`_write_connection` raises (only an idempotent caller may try again
    after :class:`async_sql.Unavailable`).
    """
    import psycopg

    try:
        return (await _booked(wakes, lambda: _one(sql, params)))[0]
    except psycopg.errors.IntegrityError as exc:
        raise Refused(type(exc).__name__) from exc
    except psycopg.Error as exc:
        # The statement was refused (bad data, say) and rolled back: the connection is fine, and
        # one request's input must not send every request of the process to the ORM. Only the
        # error's class is logged, never a value from the request.
        logger.warning("async write refused (%s); made through the ORM instead", type(exc).__name__)
        raise Refused(type(exc).__name__) from exc


async def _one(sql: str, params: Sequence[Any]) -> list[Any]:
    from psycopg import AsyncRawCursor

    async with _write_connection() as conn:
        cur = AsyncRawCursor(conn)
        await cur.execute(sql, list(params), prepare=True)
        row = await cur.fetchone()
        return [tuple(row) if row is not None else None]


def open_connections() -> int:
    """Connections the pools of this process hold now (``mcptasks_db_connections_open{pool="async_writes"}``)."""
    _drop_pools_of_closed_loops()
    return sum(int(pool.get_stats().get("pool_size", 0)) for pool in list(_pools.values()))


async def close() -> None:
    """Close this event loop's pool (tests, shutdown)."""
    pool = _pools.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        _opened.pop(id(pool), None)
        await pool.close()
