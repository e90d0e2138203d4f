"""A worker's housekeeping: its heartbeat row and lease renewal (in a thread of their own),
reaping runs whose worker died, periodic cleanup and audit sealing."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from mcptasks import conf
from mcptasks.audit import housekeeping as audit_housekeeping
from mcptasks.tasks import cleanup, runs, transitions
from mcptasks.worker import rows
from mcptasks.worker.dbthread import LeaseThread, db

logger = logging.getLogger(__name__)


def resident_memory_bytes() -> int:
    """This process's resident memory (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Housekeeping:
    """The :class:`~mcptasks.worker.loop.Worker`'s periodic duties besides claiming and running."""

    worker_id: str
    concurrency: int
    stopping: bool
    run_cleanup: bool
    running: dict[str, Any]
    _lease: LeaseThread
    _housekeeping: LeaseThread
    _last_cleanup: float
    _last_reap: float

    _cancel_local: Callable[[str], Awaitable[None]]

    async def _heartbeat_row(self) -> None:
        await self._lease(rows.worker_heartbeat)(
            worker_id=self.worker_id, hostname=socket.gethostname(), pid=os.getpid(),
            concurrency=self.concurrency, running=len(self.running), stopping=self.stopping,
            rss_bytes=resident_memory_bytes(), asyncio_tasks=len(asyncio.all_tasks()),
        )

    async def _heartbeat_loop(self) -> None:
        s = conf.get()
        while True:
            await asyncio.sleep(s.WORKER_HEARTBEAT_S)
            try:
                await self._heartbeat_row()
                entries = {task_id: attempt for task_id, (_t, _b, attempt) in self.running.items()}
                if entries:
                    for task_id in await self._lease(self._renew)(entries):
                        await self._cancel_local(task_id)
                await self._maybe_reap()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("heartbeat failed", exc_info=True)

    def _renew(self, entries: dict[str, int]) -> list[str]:
        """Extend every lease we hold in one UPDATE; return the tasks we must stop."""
        return runs.renew_leases(worker_id=self.worker_id, runs=entries)

    async def _maybe_reap(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_reap < conf.get().WORKER_HEARTBEAT_S:
            return
        self._last_reap = loop.time()
        await db(self._reap_lost)()

    def _reap_lost(self) -> int:
        """Fail tasks whose last allowed attempt lost its worker (see :func:`transitions.fail_lost_runs`)."""
        return transitions.fail_lost_runs(reaper_id=f"reaper:{self.worker_id}")

    async def _maybe_cleanup(self) -> None:
        if not self.run_cleanup:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_cleanup < conf.get().CLEANUP_INTERVAL_S:
            return
        self._last_cleanup = loop.time()
        try:
            await db(cleanup.cleanup_expired)()
        except Exception:
            logger.warning("periodic cleanup failed", exc_info=True)

    async def _seal_loop(self) -> None:
        """Chain new audit events (in a thread of its own: never queued behind tools or leases)."""
        while True:
            await asyncio.sleep(conf.get().AUDIT_SEAL_INTERVAL_S)
            try:
                await self._housekeeping(audit_housekeeping.housekeep)()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("sealing the audit log failed", exc_info=True)
