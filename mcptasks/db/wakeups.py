"""Worker wake-ups through PostgreSQL: ``NOTIFY`` in the creating statement, ``LISTEN`` in workers.

A task created in one statement (:mod:`mcptasks.models.creationsql`) also calls
``pg_notify`` in that statement: PostgreSQL delivers the notification when the statement
commits, so a listening worker is woken in the moment the task becomes claimable, with no
round trip of the creating request and no channel-layer message (a group send to wake the
workers cost the web process more than the creation, and receiving each wake-up, a channel
layer receive and its clean-up, was a fifth of a worker's CPU under load). Workers keep their
channel-layer wake-up group for everything else (plain calls, retries, the ORM path) and their
poll as the backstop.

A notification is not free: PostgreSQL serialises every notifying commit on one lock held
through its WAL flush, and wakes every listener. It is only sent while some worker waits for
one (:attr:`~mcptasks.models.WorkerHeartbeat.wants_wakeups`: it has free slots and its last
claim found the queue empty). A worker whose slots stay full claims as its runs end and opts out;
under creation load then no statement notifies (issue 27: 8.5 % more creations a second at 50
clients on two cores, ``bench/RESULTS.md``).

That check must not lose a wake-up. A worker that opts back in commits the flag and then claims
again; a creating statement reads the flag in its own snapshot, taken before it commits. If the
statement saw no waiting worker, the worker's flag committed after that snapshot, but the claim
that followed may still have run before the statement's commit: neither saw the other. So a
statement that commits a task without notifying leaves a debt (:class:`WakeLedger`), paid by
the next creating statement sent after it commits, or, if none is sent soon, by a check
statement of its own: whichever reads the flags after the commit either sees the
waiting worker and notifies, or proves that the worker's flag (and so its claim) came after the
commit, and the claim saw the task. Under load the next batch pays, and nothing more is sent.

Behind a transaction pooler a session cannot ``LISTEN`` (the pooler hands each transaction to
any server connection); there creations are not made in one statement either, and the ORM
creation sends the channel-layer wake-up (:func:`via_postgres` is false). Set
``MCPTASKS_DB_POOLER`` alike in every process.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from django.conf import settings

from mcptasks import conf
from mcptasks.db import async_sql

logger = logging.getLogger(__name__)

#: The notification channel (one database per deployment: nothing else shares it).
CHANNEL = "mcptasks_wake"

#: After the listening connection failed, wait this long before connecting again.
RETRY_S = 1.0

#: A commit that notified nobody is checked this long after it, unless a creating statement sent
#: meanwhile settles it: one creating client at a time then sends a check every few creations,
#: not one each. Only a worker that asked for wake-ups during that commit waits for the check,
#: and no longer than this.
CHECK_AFTER_S = 0.005


def notify_sql(quote: Callable[[str], str], *, table: str, column: str) -> str:
    """An SQL expression that wakes the listening workers on commit if any waits for wake-ups
    (the boolean ``column`` of the workers' ``table`` is true in a row): 1 if it notified, 0 if
    no worker waits, never NULL once evaluated. Read by :class:`WakeLedger` as the last column
    of a creating statement's row.

    It notifies whenever a worker waits, whether or not its statement creates anything: a
    statement that saw a waiting worker and stayed silent would leave an earlier commit's debt
    unpaid.
    """
    # The flags' subquery is an InitPlan, run once a statement; pg_notify runs only when it is true.
    return (f"(CASE WHEN EXISTS (SELECT 1 FROM {quote(table)} WHERE {quote(column)}) "  # noqa: S608
            f"THEN (SELECT 1 FROM (SELECT pg_notify('{CHANNEL}', '')) AS n) ELSE 0 END)")


#: Runs a check statement (``SELECT`` of :func:`notify_sql`): its row.
Check = Callable[[], Awaitable[Sequence[Any] | None]]


class WakeLedger:
    """This event loop's creations whose wake-up is not settled yet (see the module's docstring).

    Commits are numbered as they are found unsettled; :attr:`settled` is the highest number no
    worker can miss. A creating statement takes a ticket (:meth:`sent`) before it is sent, so its
    check reads the flags after every commit numbered up to the ticket, and reports its rows
    (:meth:`done`): a check that ran settles up to its ticket, and a task it committed without
    notifying is a new debt. A debt that no statement sent after it settles within
    :data:`CHECK_AFTER_S` is paid by a check statement (the ``check`` of the last :meth:`done`),
    one at a time.
    """

    def __init__(self) -> None:
        self.unsettled = 0  # commits numbered so far
        self.settled = 0
        self.in_flight: dict[int, int] = {}  # ticket -> statements sent with it, not done
        self.checking = False
        self.checks = 0  # check statements sent (tests, the benches)
        self._check_with: Check | None = None

    def sent(self) -> int:
        """A creating statement is about to be sent: its ticket."""
        ticket = self.unsettled
        self.in_flight[ticket] = self.in_flight.get(ticket, 0) + 1
        return ticket

    def done(self, ticket: int, rows: Sequence[Sequence[Any] | None], *, check: Check,
             may_have_committed: bool = False) -> None:
        """The statement sent with ``ticket`` ended: ``rows`` are its rows (led by the created
        row's key, ended by :func:`notify_sql`'s value; None for a creation it did not make),
        empty if it failed; ``may_have_committed`` if its connection failed after sending.
        ``check`` runs the statement that pays a debt."""
        self._check_with = check
        left = self.in_flight.get(ticket, 0) - 1
        if left > 0:
            self.in_flight[ticket] = left
        else:
            self.in_flight.pop(ticket, None)
        flags = [row[-1] for row in rows if row is not None and row[-1] is not None]
        if flags:
            self.settled = max(self.settled, ticket)
        created = any(row is not None and row[0] is not None for row in rows)
        if (created and 1 not in flags) or may_have_committed:
            self.unsettled += 1
        self._pay_later()

    def owed(self) -> bool:
        """Whether a commit's wake-up is still unsettled and no statement in flight will settle it."""
        return self.settled < self.unsettled and not any(t >= self.unsettled for t in self.in_flight)

    def _pay_later(self) -> None:
        if self.checking or not self.owed():
            return
        # A little later: a batch waiting behind the one that just ended is sent in the same
        # turn (tenants.infra.coalesce), and the next creation soon after; either settles it.
        self.checking = True
        asyncio.get_running_loop().call_later(CHECK_AFTER_S, self._start_check)

    def _start_check(self) -> None:
        if not self.owed():
            self.checking = False
            return
        task = asyncio.ensure_future(self._check())
        _checks.add(task)
        task.add_done_callback(_checks.discard)

    async def _check(self) -> None:
        try:
            while self.owed() and self._check_with is not None:
                check = self._check_with
                ticket = self.sent()
                self.checks += 1
                try:
                    row = await check()
                except Exception as exc:
                    # The database is unreachable or refusing: the workers' poll is the backstop.
                    self.done(ticket, [], check=check)
                    logger.warning("the wake-up check failed (%s); workers find the task by their poll",
                                   type(exc).__name__)
                    return
                self.done(ticket, [(None, *(row or (None,)))], check=check)
        finally:
            self.checking = False


_ledgers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WakeLedger] = weakref.WeakKeyDictionary()
_checks: set[asyncio.Future[None]] = set()


def ledger() -> WakeLedger:
    """The running event loop's :class:`WakeLedger`."""
    loop = asyncio.get_running_loop()
    found = _ledgers.get(loop)
    if found is None:
        found = _ledgers[loop] = WakeLedger()
    return found


def via_postgres() -> bool:
    """Whether workers listen for ``NOTIFY`` wake-ups (PostgreSQL without a transaction pooler,
    where creations are made in one statement that notifies)."""
    return (settings.DATABASES["default"]["ENGINE"] in async_sql.POSTGRESQL_ENGINES
            and conf.get().DB_POOLER == "none")


async def listen(on_wake: Callable[[], None]) -> None:
    """Call ``on_wake`` for every notification on :data:`CHANNEL`, until cancelled.

    Reconnects after a failure (``on_wake`` is called once connected, for whatever was created
    while nobody listened); meanwhile the worker's other wake-ups and its poll still claim.
    """
    import psycopg

    failing = False
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(**async_sql.conninfo(), connect_timeout=5)
            async with conn:
                await conn.execute(f"LISTEN {CHANNEL}")
                if failing:
                    logger.info("listening for task wake-ups again")
                failing = False
                on_wake()
                await _relay(conn, on_wake)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not failing:
                logger.warning("listening for task wake-ups failed (%s); retrying every %.0f s",
                               type(exc).__name__, RETRY_S)
            failing = True
        await asyncio.sleep(RETRY_S)


async def _relay(conn: Any, on_wake: Callable[[], None]) -> None:
    """Call ``on_wake`` whenever notifications arrive on ``conn`` (listening, used for nothing
    else), until the connection fails (raised) or this is cancelled.

    A reader callback on the socket rather than ``conn.notifies()``: psycopg runs a generator,
    a future and a reader registration per wait, about 150 us of a worker's CPU per
    notification, where this costs about 40 (every worker receives every creation's
    notification; issue 27, ``bench/RESULTS.md``).
    """
    pgconn = conn.pgconn
    fd = pgconn.socket
    loop = asyncio.get_running_loop()
    failed: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            pgconn.consume_input()  # raises once the connection is gone (EOF, reset)
            woken = False
            while pgconn.notifies() is not None:
                woken = True
        except Exception as exc:
            loop.remove_reader(fd)
            if not failed.done():
                failed.set_exception(exc)
            return
        if woken:
            on_wake()

    loop.add_reader(fd, readable)
    try:
        await failed
    finally:
        loop.remove_reader(fd)
