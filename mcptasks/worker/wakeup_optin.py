"""A worker's NOTIFY wake-ups: asked for only while the worker relies on them (issue 27).

PostgreSQL serialises every notifying commit on one lock held through its WAL flush, and wakes
every listener. A worker whose slots stay full claims as its runs end and needs no notification,
so it says so in its row (:attr:`~mcptasks.models.WorkerHeartbeat.wants_wakeups`), and creating
statements notify only while some worker asks (:mod:`mcptasks.db.wakeups`).
"""

from __future__ import annotations

import asyncio

from mcptasks.worker import rows
from mcptasks.worker.dbthread import LeaseThread, db

#: A worker whose claims have found a backlog for this long (its slots kept full) stops asking
#: for NOTIFY wake-ups; it asks again the moment a claim leaves the queue empty.
WAKEUP_OPT_OUT_S = 1.0


class WakeupOptIn:
    """The :class:`~mcptasks.worker.loop.Worker`'s side of :mod:`mcptasks.db.wakeups`."""

    worker_id: str
    wake: asyncio.Event
    _claimer: LeaseThread | None
    #: :func:`~mcptasks.worker.loop.tasks_may_wait` after the last claim.
    _backlog: bool
    #: Whether this worker's row asks for wake-ups (None: not known to be written), and since
    #: when its claims have found a backlog.
    _wants_wakeups: bool | None
    _backlog_since: float | None

    async def _want_wakeups(self) -> None:
        """Ask for NOTIFY wake-ups while this worker relies on them (after a claim that left no
        backlog), and stop once its claims have found a backlog for ``WAKEUP_OPT_OUT_S``: a
        worker with full slots claims as its runs end, and a notification costs every creating
        commit a global lock (:mod:`mcptasks.db.wakeups`).

        Opting in is committed before the next claim, which runs at once: a creation that read
        the flags before they changed either committed before that claim, which then sees its
        task, or leaves a debt that its process pays by reading them again after its commit.
        """
        now = asyncio.get_running_loop().time()
        if self._backlog:
            if self._backlog_since is None:
                self._backlog_since = now
            if self._wants_wakeups is not False and now - self._backlog_since >= WAKEUP_OPT_OUT_S:
                written = await (self._claimer or db)(rows.want_wakeups)(worker_id=self.worker_id, wants=False)
                self._wants_wakeups = False if written else None
            return
        self._backlog_since = None
        if self._wants_wakeups is not True:
            written = await (self._claimer or db)(rows.want_wakeups)(worker_id=self.worker_id, wants=True)
            self._wants_wakeups = True if written else None
            if written:  # without a row (its heartbeat makes one), the poll claims: no spinning
                self.wake.set()  # claim again, now that every later creation sees the flag
