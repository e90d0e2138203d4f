"""The worker's database threads: ORM calls leave the event loop for a thread that keeps its
connection (reconnecting only after a failure)."""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connection


def reconnecting(fn: Any) -> Any:
    """Wrap ORM code so a broken connection is dropped (the next call reconnects)."""

    def inner(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (OperationalError, InterfaceError):
            if not connection.in_atomic_block:
                connection.close()
            raise

    return inner


def db(fn: Any) -> Any:
    """Run ORM code in the worker's database thread.

    The connection is kept across calls (a worker is long-lived; reconnecting for every query
    would dominate short tasks) and dropped only when it breaks, so the next call reconnects.
    """
    return sync_to_async(reconnecting(fn), thread_sensitive=True)


class LeaseThread:
    """One thread of its own, with its own database connection, for heartbeats and renewals.

    Lease renewal must never queue behind tool code or the tools' database work: sync tools
    run in the worker's tool executor, async tools' ORM calls in the shared database thread,
    and this thread does nothing but keep the worker's leases and heartbeat row alive.
    """

    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcptasks-lease")

    def __call__(self, fn: Any) -> Any:
        wrapped = reconnecting(fn)

        async def run(*args: Any, **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, functools.partial(wrapped, *args, **kwargs))

        return run

    def shutdown(self) -> None:
        """Close the thread's connection and stop it."""
        self.executor.submit(connection.close)
        self.executor.shutdown(wait=True)
