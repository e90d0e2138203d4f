"""In-process background work for the serving process.

* The embedded worker (``MCPTASKS_EMBEDDED_WORKER=1``, on under ``manage.py serve``) runs tools
  in the server's own event loop, so a newcomer needs one command and no Redis.
* Periodic cleanup of expired tasks runs in every serving process (concurrent cleaners are
  safe: they skip each other's rows).
* On SIGTERM, open SSE streams are ended with a ``retry:`` hint before daphne stops, so
  clients reconnect (with ``Last-Event-ID``) elsewhere instead of seeing a cut connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async

from . import audit, bus, conf, services

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
            bus.serve_on(asyncio.get_running_loop())
            self.start()
        await self.app(scope, receive, send)

    def start(self) -> None:
        """Launch the embedded worker (if enabled), the cleanup loop and the audit sealer."""
        settings = conf.get()
        if settings.EMBEDDED_WORKER:
            from .worker import Worker

            self.worker = Worker(run_cleanup=False)
            self._tasks.append(asyncio.ensure_future(self.worker.run()))
            logger.info("embedded worker started")
        self._tasks.append(asyncio.ensure_future(
            self._every(lambda: conf.get().CLEANUP_INTERVAL_S, services.cleanup_expired, "periodic cleanup")))
        # Any process may seal; the sealer's own lock lets one at a time do it.
        self._tasks.append(asyncio.ensure_future(
            self._every(lambda: conf.get().AUDIT_SEAL_INTERVAL_S, audit.seal, "sealing the audit log")))
        self._install_shutdown_hook()

    def _install_shutdown_hook(self) -> None:
        """Wrap the server's SIGTERM handler: close streams with ``retry:`` first, then stop.

        Daphne (Twisted) cancels every application on shutdown, which cuts open streaming
        responses mid-body. Ending them properly first tells clients to come back.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: Any) -> None:
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._graceful_stop(previous, signum, frame)))

        try:
            signal.signal(signal.SIGTERM, on_sigterm)
        except ValueError:  # not the main thread of the interpreter after all
            return

    async def _graceful_stop(self, previous: Any, signum: int, frame: Any) -> None:
        from .transport.consumer import close_all_streams

        try:
            closed = await asyncio.wait_for(close_all_streams(), timeout=2)
            logger.info("shutdown: closed %d open stream(s) with a retry hint", closed)
            await bus.flush(within_s=1)  # signals of the last writes go out before the loop stops
            await asyncio.sleep(0.1)  # let the transport flush the final chunks
        except Exception:
            logger.warning("closing streams at shutdown failed", exc_info=True)
        # Hand over to the server's own handling of SIGTERM.
        if callable(previous):
            previous(signum, frame)
        else:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    @staticmethod
    async def _every(interval: Callable[[], float], job: Callable[[], Any], what: str) -> None:
        while True:
            await asyncio.sleep(interval())
            try:
                # Not in the thread-sensitive executor that request ORM calls share: a long
                # cleanup or sealing pass must not queue requests behind it.
                await sync_to_async(job, thread_sensitive=False)()
            except Exception:
                logger.warning("%s failed", what, exc_info=True)
