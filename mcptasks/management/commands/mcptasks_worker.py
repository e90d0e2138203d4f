"""``manage.py mcptasks_worker``: run tools for tasks (a thin shell around :class:`Worker`)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from mcptasks import checks, hardening
from mcptasks.processes import gc_tuning
from mcptasks.processes.embedded import bound_default_executor
from mcptasks.worker.loop import Worker
from tenants.infra import redis_url

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run an mcptasks worker: claim tasks with leases and run their tools."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--concurrency", type=int, default=None, help="Tools run at once (default setting).")
        parser.add_argument("--worker-id", default=None, help="Defaults to <hostname>-<pid>-<random>.")
        parser.add_argument("--burst", action="store_true",
                            help="Exit once nothing is runnable and every started run has ended.")
        parser.add_argument("--max-tasks", type=int, default=None,
                            help="Start at most this many runs, then exit once they have ended.")

    def handle(self, *args: Any, **opts: Any) -> None:
        hardening.require_production_secret_key("worker")
        redis_url.require_supported(str(getattr(settings, "REDIS_URL", "") or ""), "worker")
        if opts["max_tasks"] is not None and opts["max_tasks"] < 1:
            raise CommandError("--max-tasks must be at least 1")
        warning = checks.autovacuum_warning()
        if warning is not None:
            logger.warning("%s %s (%s)", warning.msg, warning.hint, warning.id)
        worker = Worker(concurrency=opts["concurrency"], worker_id=opts["worker_id"], burst=opts["burst"],
                        max_tasks=opts["max_tasks"])
        gc_tuning.tune()
        asyncio.run(self._main(worker))

    async def _main(self, worker: Worker) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        bound_default_executor(loop)
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
