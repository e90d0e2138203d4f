"""In-process background work for the serving process.

* The embedded worker (``MCPTASKS_EMBEDDED_WORKER=1``, on under ``manage.py serve``) runs tools
  in the server's own event loop, so a newcomer needs one command and no Redis.
* Periodic cleanup of expired tasks runs in every serving process (concurrent cleaners are
  safe: they skip each other's rows).
* On SIGTERM (and SIGINT), the embedded worker stops claiming, lets running tools finish within
  ``MCPTASKS_WORKER_SHUTDOWN_GRACE_S`` and hands the rest back (like ``mcptasks_worker``); then
  open SSE streams are ended with a ``retry:`` hint before daphne stops, so clients reconnect
  (with ``Last-Event-ID``) elsewhere instead of seeing a cut connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async

from mcptasks import conf
from mcptasks.audit.housekeeping import housekeep
from mcptasks.streams import signals
from mcptasks.tasks import cleanup

logger = logging.getLogger(__name__)


def bound_default_executor(loop: asyncio.AbstractEventLoop) -> None:
    """Give ``loop`` a default executor of ``MCPTASKS_SYNC_THREADS`` threads (``mcptasks-sync-N``).

    ``sync_to_async(thread_sensitive=False)`` and ``asyncio.to_thread`` run there, and each of
    its threads keeps its own PostgreSQL connection: Python's default (min(32, CPUs + 4)
    threads) made a process's connection count depend on the machine it runs on.
    """
    from concurrent.futures import ThreadPoolExecutor

    loop.set_default_executor(
        ThreadPoolExecutor(max_workers=conf.get().SYNC_THREADS, thread_name_prefix="mcptasks-sync")
    )


#: Seconds after the drain and stream close that a process still shutting down is ended.
SHUTDOWN_FORCE_AFTER_S = 15.0


def _force_exit() -> None:
    """End a shutdown that is stuck past :data:`SHUTDOWN_FORCE_AFTER_S` (leases were handed back).

    Every thread's stack goes to stderr first: what held the process is otherwise lost with it
    (a CI run saw one such stall once, with nothing in the log to say what waited)."""
    os.write(2, b"shutdown: still running after the drain (a sync tool in a thread?); exiting now\n")
    with contextlib.suppress(OSError, RuntimeError, ValueError):  # no usable stderr: exit all the same
        faulthandler.dump_traceback(all_threads=True)
    os._exit(0)


class EmbeddedRuntime:
    """ASGI wrapper that starts background loops in the server's event loop on first use."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.started = False
        self.worker: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._worker_run: asyncio.Task[Any] | None = None
        self._worker_stop: asyncio.Event | None = None
        self._stopping = False
        #: Where shutdown progress is reported (``manage.py serve`` points it at its output).
        self.announce: Callable[[str], Any] = logger.info

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not self.started and scope.get("type") in ("http", "lifespan"):
            self.started = True
            bound_default_executor(asyncio.get_running_loop())
            signals.serve_on(asyncio.get_running_loop())
            self.start()
        await self.app(scope, receive, send)

    def start(self) -> None:
        """Launch the embedded worker (if enabled), the cleanup loop and the audit sealer."""
        settings = conf.get()
        if settings.EMBEDDED_WORKER:
            from mcptasks.worker.loop import Worker

            self.worker = Worker(run_cleanup=False)
            self._worker_stop = asyncio.Event()
            self._worker_run = asyncio.create_task(self.worker.run(self._worker_stop))
            self._tasks.append(self._worker_run)
            logger.info("embedded worker started")
        self._tasks.append(asyncio.ensure_future(
            self._every(lambda: conf.get().CLEANUP_INTERVAL_S, cleanup.cleanup_expired, "periodic cleanup")))
        # Beside an embedded worker this process seals (the sealer's own lock lets one process
        # at a time do it). Beside worker processes, which seal, it is only the backstop: hashing
        # here took the event loop's CPU on the request path (issue 27).
        backstop = not settings.EMBEDDED_WORKER
        self._tasks.append(asyncio.ensure_future(self._every(
            lambda: conf.get().AUDIT_SEAL_INTERVAL_S, lambda: housekeep(backstop=backstop), "sealing the audit log")))
        self._install_shutdown_hook()

    def _install_shutdown_hook(self) -> None:
        """Wrap the server's SIGTERM handler: close streams with ``retry:`` first, then stop.

        Daphne (Twisted) cancels every application on shutdown, which cuts open streaming
        responses mid-body. Ending them properly first tells clients to come back.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)

            def on_signal(signum: int, frame: Any, previous: Any = previous) -> None:
                if self._stopping:
                    if signum == signal.SIGINT:
                        # A second Ctrl-C: the developer wants out now. Leases of running tasks
                        # then lapse and the next start recovers them.
                        os.write(2, b"shutdown: forced by a second interrupt; running tasks recover by lease expiry\n")
                        os._exit(130)
                    return  # one shutdown at a time: a repeated SIGTERM does not cut the drain short
                self._stopping = True
                loop.call_soon_threadsafe(
                    lambda: asyncio.ensure_future(self._graceful_stop(previous, signum, frame)))

            try:
                signal.signal(sig, on_signal)
            except ValueError:  # not the main thread of the interpreter after all
                return

    async def _drain_worker(self) -> None:
        """Stop the embedded worker the way ``mcptasks_worker`` stops on SIGTERM, and say so."""
        worker, run, stop = self.worker, self._worker_run, self._worker_stop
        if worker is None or run is None or stop is None or run.done():
            return
        grace = conf.get().WORKER_SHUTDOWN_GRACE_S
        running = len(worker.running)
        if running:
            self.announce(f"shutdown: draining {running} running task(s) (grace {grace:g}s); "
                          "the rest are handed back to the next worker")
        handed_before = worker.handed_back_total
        stop.set()
        try:
            # The worker waits ``grace`` for its tools, then releases the rest's leases.
            await asyncio.wait_for(asyncio.shield(run), timeout=grace + 10)
        except Exception:
            logger.warning("shutdown: the embedded worker did not stop cleanly", exc_info=True)
        handed = worker.handed_back_total - handed_before
        if running:
            self.announce(f"shutdown: handed back {handed} task(s); {running - handed} finished within the grace")

    async def _graceful_stop(self, previous: Any, signum: int, frame: Any) -> None:
        from mcptasks.endpoint.stream_session import close_all_streams

        await self._drain_worker()
        try:
            closed = await asyncio.wait_for(close_all_streams(), timeout=2)
            logger.info("shutdown: closed %d open stream(s) with a retry hint", closed)
            await signals.flush(within_s=1)  # signals of the last writes go out before the loop stops
            await asyncio.sleep(0.1)  # let the transport flush the final chunks
        except Exception:
            logger.warning("closing streams at shutdown failed", exc_info=True)
        # A shutdown that outlives this bound is forced: a sync tool still running in a thread
        # nothing can interrupt (its task already handed back) kept `serve` alive until the tool
        # ended, a minute in CI, because the interpreter waits for non-daemon threads at exit.
        watchdog = threading.Timer(SHUTDOWN_FORCE_AFTER_S, _force_exit)
        watchdog.daemon = True
        watchdog.start()
        # Hand over to the server's own handling of SIGTERM.
        if callable(previous):
            previous(signum, frame)
        else:
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            os.kill(os.getpid(), signum)

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
