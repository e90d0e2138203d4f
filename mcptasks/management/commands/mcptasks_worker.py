"""``manage.py mcptasks_worker``: run tools for tasks (a thin shell around :class:`Worker`)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from mcptasks import hardening
from mcptasks.worker import Worker


class Command(BaseCommand):
    help = "Run an mcptasks worker: claim tasks with leases and run their tools."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--concurrency", type=int, default=None, help="Tools run at once (default setting).")
        parser.add_argument("--worker-id", default=None, help="Defaults to <hostname>-<pid>-<random>.")

    def handle(self, *args: Any, **opts: Any) -> None:
        hardening.require_production_secret_key("worker")
        asyncio.run(self._main(opts["concurrency"], opts["worker_id"]))

    async def _main(self, concurrency: int | None, worker_id: str | None) -> None:
        worker = Worker(concurrency=concurrency, worker_id=worker_id)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # SIGTERM/SIGINT: stop claiming, let running tools finish within the grace period,
        # then hand back the rest.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        self.stdout.write(f"worker {worker.worker_id} running (concurrency {worker.concurrency})")
        self.stdout.flush()
        await worker.run(stop)
        if worker.abandoned_threads:
            # A handed-back sync tool still runs in a thread that nothing can interrupt; its task
            # already belongs to another worker, so exit now instead of waiting for it.
            self.stdout.write(f"worker {worker.worker_id} exiting with a handed-back sync tool still running")
            self.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
