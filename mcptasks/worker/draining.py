"""A worker's shutdown: running tools get the grace to finish, the rest are handed back at once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mcptasks.tasks import runs
from mcptasks.tools.registry import Registry
from mcptasks.worker.dbthread import db

logger = logging.getLogger(__name__)


class Draining:
    """The :class:`~mcptasks.worker.loop.Worker`'s drain at shutdown."""

    worker_id: str
    registry: Registry
    running: dict[str, Any]
    abandoned_threads: bool
    handed_back_total: int

    async def _drain(self, grace: float) -> None:
        """Let running tools finish within ``grace``; hand the rest back."""
        if not self.running:
            return
        logger.info("worker %s draining %d running tasks (grace %gs)", self.worker_id, len(self.running), grace)
        _done, pending = await asyncio.wait([t for t, _b, _a in self.running.values()], timeout=grace)
        handed: list[tuple[str, int]] = []
        for task_id, (atask, backend, attempt) in list(self.running.items()):
            if atask not in pending:
                continue
            # Whatever the interrupted run does from now on is discarded (ctx.cancelled is True).
            backend.handed_back = True
            backend.cancel_flag = True
            backend.answered.set()
            tool = self.registry.get_tool(backend.task.tool_name)
            if tool is not None and not tool.is_async:
                self.abandoned_threads = True
            atask.cancel()
            handed.append((task_id, attempt))
        if pending:
            await asyncio.wait(pending, timeout=2)
        if handed:
            n = await db(self._release)(handed)
            self.handed_back_total += n
            logger.info("worker %s handed back %d tasks", self.worker_id, n)

    def _release(self, handed: list[tuple[str, int]]) -> int:
        """Release our leases at once; the interrupted attempt does not count against the limit."""
        return runs.hand_back(worker_id=self.worker_id, runs=handed)
