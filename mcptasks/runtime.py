"""In-process background work for the serving process.

* The embedded worker (``MCPTASKS_EMBEDDED_WORKER=1``, on under ``manage.py serve``) runs tools
  in the server's own event loop, so a newcomer needs one command and no Redis.
* Periodic cleanup of expired tasks runs in every serving process (concurrent cleaners are
  safe: they skip each other's rows).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import sync_to_async

from . import conf, services

logger = logging.getLogger(__name__)


class EmbeddedRuntime:
    """ASGI wrapper that starts background loops in the server's event loop on first use."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.started = False
        self.worker: Any = None
        self._tasks: list[asyncio.Task[Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not self.started and scope.get("type") in ("http", "lifespan"):
            self.started = True
            self.start()
        await self.app(scope, receive, send)

    def start(self) -> None:
        """Launch the embedded worker (if enabled) and the cleanup loop."""
        settings = conf.get()
        if settings.EMBEDDED_WORKER:
            from .worker import Worker

            self.worker = Worker(run_cleanup=False)
            self._tasks.append(asyncio.ensure_future(self.worker.run()))
            logger.info("embedded worker started")
        self._tasks.append(asyncio.ensure_future(self._cleanup_loop()))

    async def _cleanup_loop(self) -> None:
        while True:
            await asyncio.sleep(conf.get().CLEANUP_INTERVAL_S)
            try:
                await sync_to_async(services.cleanup_expired)()
            except Exception:
                logger.warning("periodic cleanup failed", exc_info=True)
