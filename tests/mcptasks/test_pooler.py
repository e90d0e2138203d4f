"""Behind a transaction pooler (PgBouncer 1.18, ``pool_mode = transaction``): no session state.

The async reads (:mod:`mcptasks.db.async_sql`) share one PgBouncer server connection between
clients here (``default_pool_size = 1``), as busy production pools do: a startup option, a
named prepared statement or a session ``SET`` would fail or leak to another client.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from mcptasks import conf
from mcptasks.conf import AppSettings
from mcptasks.db import async_sql as fastreads
from mcptasks.db import config as dbconfig
from mcptasks.models import McpSession, Task
from tests.support.factories import make_auth, make_session, make_task
from tests.support.fast_subset import starts_processes
from tests.support.pgbouncer_proc import PrivatePgBouncer
from tests.support.requirements import require_postgres
from tests.support.tcp_gate import TcpGate

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
@starts_processes
def bouncer() -> Iterator[PrivatePgBouncer]:
    """A private PgBouncer with ONE server connection per database in front of the test PostgreSQL."""
    require_postgres()
    db = connections["default"].settings_dict
    b = PrivatePgBouncer(f"postgres://{db['USER'] or 'postgres'}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}",
                         pool_size=1)
    b.start()
    yield b
    b.stop()


@pytest.fixture
def through_bouncer(bouncer: PrivatePgBouncer, settings: Any) -> Iterator[None]:
    """The async reads connect through ``bouncer`` with ``DB_POOLER=transaction``.

    The database settings are changed in place (every thread's connection wrapper shares the
    dict), after Django's own test connection is open: that one stays direct and outlives the
    PgBouncer.
    """
    wrapper = connections["default"]
    wrapper.ensure_connection()
    db = wrapper.settings_dict
    saved = dict(db)
    db["HOST"], db["PORT"] = "127.0.0.1", str(bouncer.port)
    # What settings.py builds for this mode (no startup options).
    direct = dbconfig.pg_connection_options(AppSettings(DB_POOLER="none"))
    db["OPTIONS"] = {
        **{k: v for k, v in db.get("OPTIONS", {}).items() if k not in direct},
        **dbconfig.pg_connection_options(AppSettings(DB_POOLER="transaction")),
    }
    settings.MCPTASKS = {**settings.MCPTASKS, "DB_POOLER": "transaction", "ASYNC_READS": True}
    fastreads._failed_until = 0.0
    try:
        yield
    finally:
        db.clear()
        db.update(saved)
        fastreads._failed_until = 0.0


def test_async_reads_from_several_clients_share_one_pooled_server_connection(
    through_bouncer: None, bouncer: PrivatePgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    auth = make_auth()
    session = make_session(auth)
    tasks = [make_task(auth, session=session) for _ in range(3)]
    errors: list[BaseException] = []

    async def reads(n: int) -> None:
        try:
            for i in range(40):
                assert fastreads.available(), "the async path was given up"
                task = tasks[(i + n) % len(tasks)]
                # Different statement shapes (and parameter counts) from each client, interleaved
                # on the one server connection.
                if (i + n) % 2:
                    row = await fastreads.fetch_one(Task, where=["task_id = %s"], params=[task.task_id])
                else:
                    row = await fastreads.fetch_one(
                        Task, where=["task_id = %s", "tenant_id = %s", "principal_id = %s", "session_id = %s"],
                        params=[task.task_id, auth.tenant_id, auth.principal_id, session.pk])
                assert row is not None and row.task_id == task.task_id
                # UTC without a TimeZone startup option or SET: the same instant, in UTC.
                assert row.created_at == task.created_at and row.created_at.utcoffset() == dt.timedelta(0)
                found = await fastreads.fetch_one(McpSession, where=["id = %s"], params=[session.pk])
                assert found is not None
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            await fastreads.close()

    caplog.set_level(logging.WARNING, logger="mcptasks.db.async_sql")
    # One event loop per thread: one async connection each, like several web processes.
    threads = [threading.Thread(target=asyncio.run, args=(reads(n),)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert "login attempt" in bouncer.log  # the reads went through PgBouncer
    assert [r.getMessage() for r in caplog.records if r.name == "mcptasks.db.async_sql"] == []


def test_behind_the_pooler_creations_take_the_orm_transaction(
    through_bouncer: None, bouncer: PrivatePgBouncer, settings: Any
) -> None:
    """Behind a transaction pooler a creation is not one statement (``mcptasks/db/write_conns.py``):
    its timeouts could only be set in a transaction around it, and a host lost before that
    transaction's COMMIT left it open holding the tenant's row (caught by
    tests/e2e/test_reference_deployment.py). The ORM transaction, bounded per transaction by the
    pooled backend, makes it; directly against PostgreSQL the statement is used."""
    from mcptasks.db import write_conns
    from mcptasks.db import write_pool as dbwrites
    from mcptasks.tasks import creation
    from tenants.selectors import clear_limits_cache, effective_limits
    from tests.support.factories import demo_tool

    settings.MCPTASKS = {**settings.MCPTASKS, "WRITE_THREADS": 2}
    clear_limits_cache()
    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)
    assert fastreads.available() and not write_conns.available()
    orm_calls: list[Any] = []

    async def counted(fn: Any, /, **kwargs: Any) -> Any:
        from asgiref.sync import sync_to_async

        orm_calls.append(fn)
        return await sync_to_async(fn)(**kwargs)  # the test's thread and connection

    async def create() -> Any:
        try:
            return await creation.acreate_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1},
                                               request_id=1, progress_token=None, idempotency_key="pooled")
        finally:
            await write_conns.close()
            await fastreads.close()

    monkey = pytest.MonkeyPatch()
    monkey.setattr(dbwrites, "run", counted)
    try:
        from asgiref.sync import async_to_sync

        task = async_to_sync(create)()
    finally:
        monkey.undo()
    assert orm_calls == [creation.create_task]
    assert Task.objects.filter(task_id=task.task_id).exists()
    settings.MCPTASKS = {**settings.MCPTASKS, "DB_POOLER": "none"}
    assert write_conns.available()


def test_the_pooler_mode_sets_no_session_state_and_bounds_each_transaction() -> None:
    pooled = dbconfig.pg_connection_options(AppSettings(DB_POOLER="transaction"))
    assert "options" not in pooled  # PgBouncer: "unsupported startup parameter: options"
    assert pooled["prepare_threshold"] is None and pooled["keepalives"] == 1
    direct = dbconfig.pg_connection_options(AppSettings(DB_POOLER="none", DB_LOCK_TIMEOUT_MS=1234))
    assert "-c lock_timeout=1234" in direct["options"] and "prepare_threshold" not in direct
    sql = dbconfig.transaction_settings_sql(AppSettings(DB_IDLE_IN_TRANSACTION_TIMEOUT_MS=777))
    assert "set_config('idle_in_transaction_session_timeout', '777', true)" in sql
    with pytest.raises(Exception, match="DB_POOLER"):
        dbconfig.pg_connection_options(AppSettings(DB_POOLER="session; DROP"))
    assert conf.get().DB_POOLER in dbconfig.POOLERS


def test_the_pooled_backend_bounds_each_transaction_without_leaking_to_the_shared_server_connection(
    bouncer: PrivatePgBouncer, settings: Any
) -> None:
    from mcptasks.db.pooled_postgresql.base import DatabaseWrapper

    settings.MCPTASKS = {**settings.MCPTASKS, "DB_POOLER": "transaction", "DB_LOCK_TIMEOUT_MS": 4321,
                         "DB_IDLE_IN_TRANSACTION_TIMEOUT_MS": 5432}
    db = dict(connections["default"].settings_dict)
    db.update(HOST="127.0.0.1", PORT=str(bouncer.port),
              OPTIONS=dbconfig.pg_connection_options(AppSettings(DB_POOLER="transaction")))
    pooled = DatabaseWrapper(db, alias="pooled")
    try:
        with pooled.cursor() as cur:
            cur.execute("SELECT current_setting('lock_timeout')")
            before = cur.fetchone()[0]
        pooled.set_autocommit(False)  # what atomic() does first
        with pooled.cursor() as cur:
            cur.execute("SELECT current_setting('lock_timeout'), "
                        "current_setting('idle_in_transaction_session_timeout')")
            inside = cur.fetchone()
        pooled.commit()
        pooled.set_autocommit(True)
        # One server connection (default_pool_size = 1): what a transaction set is gone after it.
        with pooled.cursor() as cur:
            cur.execute("SELECT current_setting('lock_timeout')")
            after = cur.fetchone()[0]
    finally:
        pooled.close()
    assert inside == ("4321ms", "5432ms")
    assert before == after == "0"


def test_a_transaction_and_its_bounds_reach_the_server_in_one_flight(settings: Any) -> None:
    """``BEGIN`` and the ``SET LOCAL`` of the bounds leave without a round trip between them.

    Before, the driver sent ``BEGIN`` and waited for its answer before the statement setting the
    bounds: a client host lost right then left a transaction with no timeout at all (caught by
    tests/e2e/test_reference_deployment.py: ``idle in transaction``, query ``BEGIN``, still open
    20 s later, holding a PgBouncer server connection and a backend until keepalives give up).
    """
    require_postgres()
    from mcptasks.db.pooled_postgresql.base import DatabaseWrapper

    settings.MCPTASKS = {**settings.MCPTASKS, "DB_POOLER": "transaction", "DB_IDLE_IN_TRANSACTION_TIMEOUT_MS": 6543}
    db = dict(connections["default"].settings_dict)
    gate = TcpGate((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)), b"set_config")
    db.update(HOST="127.0.0.1", PORT=str(gate.port),
              OPTIONS=dbconfig.pg_connection_options(AppSettings(DB_POOLER="transaction")))
    pooled = DatabaseWrapper(db, alias="pooled")
    try:
        pooled.ensure_connection()
        pooled.set_autocommit(False)  # what atomic() does first
        with pooled.cursor() as cur:
            cur.execute("SELECT current_setting('idle_in_transaction_session_timeout')")
            inside = cur.fetchone()[0]
        pooled.commit()
        pooled.set_autocommit(True)
    finally:
        pooled.close()
        gate.close()
    assert gate.same_flight is True, "the driver waited for BEGIN's answer before sending the bounds"
    assert inside == "6543ms"


def test_exports_read_in_keyset_pages_newest_first() -> None:
    from mcptasks.models import AuditEvent

    require_postgres()
    auth = make_auth()
    for n in range(7):
        AuditEvent.objects.create(tenant_id=auth.tenant_id, action="test.page", data={"n": n})
    qs = AuditEvent.objects.filter(action="test.page")
    ids = [ev.pk for ev in dbconfig.newest_first_pages(qs, size=3)]
    assert ids == sorted(qs.values_list("pk", flat=True), reverse=True) and len(ids) == 7
