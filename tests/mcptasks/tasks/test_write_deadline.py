"""A request-path write that finds no free write thread in time fails (503) instead of hanging."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from mcptasks.db import write_pool as dbwrites
from mcptasks.endpoint.errors import answer
from tests.support.requirements import require_postgres

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_write_queued_past_the_deadline_is_dropped_and_answered_503(settings: Any) -> None:
    require_postgres()
    settings.MCPTASKS = {**settings.MCPTASKS, "WRITE_THREADS": 1, "WRITE_QUEUE_TIMEOUT_S": 0.5}
    release, blocking = threading.Event(), threading.Event()
    ran: list[str] = []

    def stuck() -> str:  # a write blocked on a lock
        blocking.set()
        release.wait(10)
        ran.append("stuck")
        return "stuck"

    def queued() -> str:
        ran.append("queued")
        return "queued"

    async def scenario() -> tuple[Any, float, Any]:
        first = asyncio.ensure_future(dbwrites.run(stuck))
        # The one write thread is taken once the stuck write runs.
        assert await asyncio.to_thread(blocking.wait, 10), "the stuck write never started"
        t0 = time.monotonic()
        try:
            await dbwrites.run(queued)
            outcome: Any = "ran"
        except dbwrites.WriteQueueTimeout as exc:
            outcome = exc
        waited = time.monotonic() - t0
        release.set()
        done = await first
        # The dropped write's turn comes once the stuck one ends (one thread, in order): a call
        # queued after it has run only once that turn has passed. Awaited here, while this loop
        # still runs: its end would cancel a write still queued, hiding one that was not dropped.
        pool = dbwrites.write_pool()
        assert pool is not None
        await asyncio.wrap_future(pool.submit(lambda: None))
        return outcome, waited, done

    outcome, waited, first = async_to_sync(scenario)()
    assert isinstance(outcome, dbwrites.WriteQueueTimeout)
    assert 0.4 <= waited < 3.0
    assert first == "stuck"
    # The dropped write never runs later (its turn has passed, above): its caller was told it
    # was not made.
    assert ran == ["stuck"]
    error, status, headers = answer(outcome)
    assert status == 503 and headers.get("Retry-After") and error.message == "Service temporarily unavailable"
    # A write that starts in time runs normally.
    assert async_to_sync(dbwrites.run)(queued) == "queued"


def test_database_and_redis_connections_are_bounded() -> None:
    """Timeouts and TCP keepalives reach a real connection; Redis connections probe too."""
    require_postgres()
    from django.conf import settings as django_settings
    from django.db import connection

    from tenants import kv

    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('lock_timeout'),"
                    " current_setting('statement_timeout')")
        idle, lock, statement = cur.fetchone()
    assert (idle, lock, statement) == ("1min", "10s", "2min")
    options = django_settings.DATABASES["default"]["OPTIONS"]
    assert options["keepalives"] == 1 and options["keepalives_idle"] == 30
    assert kv.keepalive_options()["socket_keepalive"] is True
    hosts = django_settings.CHANNEL_LAYERS["default"].get("CONFIG", {}).get("hosts", [{}])
    assert all(h.get("socket_keepalive") for h in hosts) if kv.redis_url() else True
