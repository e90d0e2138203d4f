"""Worker wake-ups through PostgreSQL: ``NOTIFY`` in the creating statement, ``LISTEN`` in workers.

A task created in one statement (:mod:`mcptasks.models.creationsql`) also calls
``pg_notify`` in that statement: PostgreSQL delivers the notification when the statement
commits, so a listening worker is woken in the moment the task becomes claimable, with no
round trip of the creating request and no channel-layer message (a group send to wake the
workers cost the web process more than the creation, and receiving each wake-up, a channel
layer receive and its clean-up, was a fifth of a worker's CPU under load). Workers keep their
channel-layer wake-up group for everything else (plain calls, retries, the ORM path) and their
poll as the backstop.

Behind a transaction pooler a session cannot ``LISTEN`` (the pooler hands each transaction to
any server connection); there creations are not made in one statement either, and the ORM
creation sends the channel-layer wake-up (:func:`via_postgres` is false). Set
``MCPTASKS_DB_POOLER`` alike in every process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings

from mcptasks import conf
from mcptasks.db import async_sql

logger = logging.getLogger(__name__)

#: The notification channel (one database per deployment: nothing else shares it).
CHANNEL = "mcptasks_wake"

#: After the listening connection failed, wait this long before connecting again.
RETRY_S = 1.0


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
