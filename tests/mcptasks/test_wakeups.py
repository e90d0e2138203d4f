"""Worker wake-ups through PostgreSQL: a task created in one statement notifies on commit while a
worker waits for wake-ups, and never leaves a waiting worker asleep (the ledger's own rules are in
tests/mcptasks/db/test_wake_ledger.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from mcptasks.db import async_sql, wakeups, write_conns
from mcptasks.models import Task, WorkerHeartbeat
from mcptasks.streams import signals
from mcptasks.tasks import creation
from mcptasks.worker import rows
from tenants.selectors import clear_limits_cache, effective_limits
from tests.support.factories import demo_tool, make_auth, make_session
from tests.support.requirements import require_postgres

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _postgres() -> None:
    require_postgres()
    async_sql._failed_until = 0.0


def _worker_row(*, wants: bool, worker_id: str = "w-listening") -> None:
    """A live worker's row, asking for wake-ups or not."""
    rows.worker_heartbeat(worker_id=worker_id, hostname="h", pid=1, concurrency=1, running=0)
    assert rows.want_wakeups(worker_id=worker_id, wants=wants)


@contextlib.asynccontextmanager
async def _listening() -> AsyncIterator[list[float]]:
    """A worker's listener, once it listens: yields the times of the wake-ups that arrive (the
    first call, made on connecting, left out); on leaving, this loop's connections are closed."""
    loop = asyncio.get_running_loop()
    woken: list[float] = []
    connected = asyncio.Event()

    def on_wake() -> None:
        woken.append(loop.time())
        connected.set()

    listener = asyncio.ensure_future(wakeups.listen(on_wake))
    try:
        await asyncio.wait_for(connected.wait(), 10)
        woken.clear()
        yield woken
    finally:
        listener.cancel()
        await write_conns.close()
        await async_sql.close()


def _create_while_listening(auth: Any, session: Any) -> tuple[list[float], float]:
    """(when each wake-up arrived, when the creation returned), on one event loop."""

    async def main() -> tuple[list[float], float]:
        loop = asyncio.get_running_loop()
        async with _listening() as woken:
            await creation.acreate_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1},
                                        request_id=1, progress_token=None)
            created = loop.time()
            for _ in range(100):
                if woken:
                    break
                await asyncio.sleep(0.01)
            return woken, created

    return asyncio.run(main())


def test_a_task_created_in_one_statement_wakes_listening_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """No channel-layer wake-up is sent: the notification comes with the commit."""
    _worker_row(wants=True)
    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)
    layer_wakes: list[int] = []
    monkeypatch.setattr(signals, "wake_workers", lambda: layer_wakes.append(1))
    assert wakeups.via_postgres()
    woken, _created = _create_while_listening(auth, session)
    assert len(woken) == 1 and layer_wakes == []


def test_no_creation_notifies_while_no_worker_waits_for_wake_ups() -> None:
    """Workers whose slots stay full opt out: a notification would cost the creating commit
    PostgreSQL's global notify lock for nothing. Only the check after the commit reads the flags."""
    _worker_row(wants=False)
    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)

    async def main() -> tuple[list[float], int, bool]:
        async with _listening() as woken:
            for i in range(3):
                await creation.acreate_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1},
                                            request_id=i, progress_token=None)
            await asyncio.sleep(0.5)
            return woken, wakeups.ledger().checks, wakeups.ledger().owed()

    notified, checks, owed = asyncio.run(main())
    assert notified == []
    assert checks >= 1 and not owed  # the last commit was checked after it, and settled
    assert Task.objects.filter(session_id=session.pk).count() == 3


def test_a_worker_that_asks_while_a_creation_runs_is_still_woken() -> None:
    """The race the ledger closes. The creating statement reads the flags in its snapshot (no
    worker waits) and then waits for its tenant's row; meanwhile the worker asks for wake-ups
    and claims, finding nothing, since the task is not committed. The statement then commits
    without notifying: the process reads the flags again after the commit and wakes the worker."""
    import psycopg

    from tenants.models import Tenant

    _worker_row(wants=False)
    auth = make_auth()
    session = make_session(auth)
    Tenant.objects.filter(pk=auth.tenant_id).update(max_concurrent_tasks=50)  # counted: takes the row
    clear_limits_cache()
    effective_limits(tenant_id=auth.tenant_id)
    info = async_sql.conninfo()

    async def main() -> tuple[list[float], float, int, int]:
        loop = asyncio.get_running_loop()
        holder = psycopg.connect(**{**info, "autocommit": False})  # holds the tenant's row
        try:
            async with _listening() as woken:
                holder.execute(f"SELECT 1 FROM {Tenant._meta.db_table} WHERE id = %s FOR NO KEY UPDATE",  # noqa: S608
                               [auth.tenant_id])
                creating = asyncio.ensure_future(creation.acreate_task(
                    auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1}, request_id=1,
                    progress_token=None))
                with psycopg.connect(**{**info, "autocommit": True}) as worker:
                    for _ in range(500):  # until the statement waits for the row (its snapshot taken)
                        if worker.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                          "AND datname = current_database()").fetchone() == (1,):
                            break
                        await asyncio.sleep(0.01)
                    else:
                        raise AssertionError("the creation never waited for the tenant's row")
                    # The worker asks for wake-ups (committed), then claims: nothing is committed yet.
                    worker.execute(f"UPDATE {WorkerHeartbeat._meta.db_table} SET wants_wakeups = true")  # noqa: S608
                    claimable = worker.execute(f"SELECT count(*) FROM {Task._meta.db_table} "  # noqa: S608
                                               "WHERE session_id = %s", [session.pk]).fetchone()
                holder.rollback()
                await asyncio.wait_for(creating, 10)
                created = loop.time()
                for _ in range(200):
                    if woken:
                        break
                    await asyncio.sleep(0.01)
                assert claimable is not None
                return woken, created, wakeups.ledger().checks, int(claimable[0])
        finally:
            holder.close()

    woken, created, checks, claimable = asyncio.run(main())
    assert claimable == 0
    assert len(woken) == 1 and woken[0] >= created
    assert checks == 1  # by the check: the statement did not notify, it had not seen the worker ask


def test_behind_a_transaction_pooler_workers_do_not_listen() -> None:
    """A pooler cannot carry a LISTEN session: there creations take the ORM path, which sends
    the channel-layer wake-up (tests/mcptasks/test_pooler.py)."""
    assert wakeups.via_postgres()
    from django.conf import settings
    from django.test import override_settings

    with override_settings(MCPTASKS={**settings.MCPTASKS, "DB_POOLER": "transaction"}):
        assert not wakeups.via_postgres() and not write_conns.available()


def test_the_listener_reconnects_after_its_connection_is_killed() -> None:
    """A terminated backend (a failover, an idle-connection killer) is reconnected to, and
    ``on_wake`` is called again once it listens (whatever was created meanwhile is claimed)."""
    import psycopg

    async def main() -> int:
        calls: list[int] = []
        listener = asyncio.ensure_future(wakeups.listen(lambda: calls.append(1)))
        try:
            for _ in range(200):
                if calls:
                    break
                await asyncio.sleep(0.01)
            async with await psycopg.AsyncConnection.connect(**async_sql.conninfo()) as admin:
                await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE query = %s AND datname = current_database() AND pid <> pg_backend_pid()",
                                    [f"LISTEN {wakeups.CHANNEL}"])
            for _ in range(500):
                if len(calls) >= 2:
                    break
                await asyncio.sleep(0.01)
            return len(calls)
        finally:
            listener.cancel()

    assert asyncio.run(main()) >= 2


def test_the_relay_wakes_per_notification_and_leaves_no_reader_behind() -> None:
    """The socket reader that replaced psycopg's ``notifies()`` (issue 27: a third of the CPU per
    notification): each notification wakes, a cancelled or failed relay unregisters its reader,
    and a killed connection ends the relay with an error instead of a deaf listener."""
    import psycopg

    async def main() -> tuple[int, bool, bool, bool]:
        loop = asyncio.get_running_loop()
        calls: list[int] = []
        conn = await psycopg.AsyncConnection.connect(**async_sql.conninfo())
        await conn.execute(f"LISTEN {wakeups.CHANNEL}")
        fd = conn.pgconn.socket
        relay = asyncio.ensure_future(wakeups._relay(conn, lambda: calls.append(1)))
        async with await psycopg.AsyncConnection.connect(**async_sql.conninfo()) as sender:
            for sent in range(1, 4):
                await sender.execute(f"NOTIFY {wakeups.CHANNEL}")
                for _ in range(200):
                    if len(calls) >= sent:
                        break
                    await asyncio.sleep(0.005)
            woken = len(calls)
            relay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await relay
            cancelled_left_reader = loop.remove_reader(fd)
            # A relay whose connection is killed ends with the error (the listener reconnects).
            relay = asyncio.ensure_future(wakeups._relay(conn, lambda: None))
            await sender.execute("SELECT pg_terminate_backend(%s)", [conn.pgconn.backend_pid])
            try:
                await asyncio.wait_for(relay, 5)
                failed = False
            except psycopg.Error:
                failed = True
            failed_left_reader = loop.remove_reader(fd)
        await conn.close()
        return woken, cancelled_left_reader, failed, failed_left_reader

    woken, cancelled_left_reader, failed, failed_left_reader = asyncio.run(main())
    assert woken == 3
    assert not cancelled_left_reader and not failed_left_reader
    assert failed
