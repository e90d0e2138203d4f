"""A task created from async code on PostgreSQL: one statement, the same rows as the ORM path.

:func:`mcptasks.tasks.creation.acreate_task` writes the task, its audit event and its quota slot
in one statement (``mcptasks/models/creationsql.py``); whatever that statement cannot decide
alone goes to :func:`mcptasks.tasks.creation.create_task`. These tests hold it to the ORM path's
guarantees: the same row, exact quotas under races, no lock for a tenant without limits,
idempotent retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest
from django.db import connections

from mcptasks.db import async_sql, write_conns
from mcptasks.db import write_pool as dbwrites
from mcptasks.models import AuditEvent, Task
from mcptasks.tasks import creation
from tenants.exceptions import QuotaExceeded
from tenants.models import Principal, Tenant
from tenants.selectors import clear_limits_cache, effective_limits
from tests.support.async_db import run_closing
from tests.support.factories import demo_tool, make_auth, make_session
from tests.support.requirements import require_postgres
from tests.support.row_locks import counter_rows_held

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _postgres(settings: Any) -> None:
    require_postgres()
    async_sql._failed_until = 0.0
    settings.TENANTS = {**settings.TENANTS, "TASK_MAX_CONCURRENT": 0}
    clear_limits_cache()


class _OrmCalls:
    """Counts the creations that went to the ORM path (a write thread)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = dbwrites.run

        async def counted(fn: Any, /, **kwargs: Any) -> Any:
            self.calls += 1
            return await real(fn, **kwargs)

        monkeypatch.setattr(dbwrites, "run", counted)


def _create(auth: Any, session: Any, n: int | str, **extra: Any) -> Awaitable[Task]:
    return creation.acreate_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1},
                                 request_id=n, progress_token=None, **extra)


_COMPARED = [f.attname for f in Task._meta.concrete_fields
             if f.attname not in {"seq", "task_id", "created_at", "last_updated_at", "expires_at", "request_id",
                                  "idempotency_key"}]


def test_one_statement_writes_what_the_orm_path_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)  # the tenant's limits cached, as after its first request
    orm = _OrmCalls(monkeypatch)
    fast = run_closing(lambda: _create(auth, session, 1, requested_ttl_ms=60_000, idempotency_key="k1"))
    assert orm.calls == 0, "the one-statement path should have been taken"
    slow = creation.create_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1}, request_id=2,
                                progress_token=None, requested_ttl_ms=60_000, idempotency_key="k2")
    stored, expected = Task.objects.get(pk=fast.pk), Task.objects.get(pk=slow.pk)
    assert stored.task_id == fast.task_id and stored.wire() == fast.wire()
    assert {a: getattr(stored, a) for a in _COMPARED} == {a: getattr(expected, a) for a in _COMPARED}
    assert stored.expires_at is not None and expected.expires_at is not None
    assert stored.expires_at - stored.created_at == expected.expires_at - expected.created_at
    assert stored.request_id == 1 and stored.idempotency_key == "k1"
    event = AuditEvent.objects.get(task_id=fast.task_id)
    twin = AuditEvent.objects.get(task_id=slow.task_id)
    assert (event.action, event.data, event.chain, event.principal_ref, event.tenant_id) == (
        twin.action, twin.data, twin.chain, twin.principal_ref, twin.tenant_id)


def test_a_retried_key_returns_the_first_task(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)

    async def twice() -> tuple[Task, Task]:
        return await _create(auth, session, 1, idempotency_key="same"), await _create(auth, session, 1,
                                                                                      idempotency_key="same")

    first, second = run_closing(twice)
    assert first.task_id == second.task_id
    assert Task.objects.filter(tenant_id=auth.tenant_id).count() == 1
    assert AuditEvent.objects.filter(task_id=first.task_id, action="task.create").count() == 1


def _race(auths: list[Any], *, total: int = 200) -> tuple[int, list[dict[str, Any]], int]:
    """``total`` creations at once on one event loop (over the write pool); (created, refusals, ORM calls)."""
    sessions = [make_session(a) for a in auths]
    for a in auths:
        effective_limits(tenant_id=a.tenant_id)
    refused: list[dict[str, Any]] = []

    async def one(i: int) -> int:
        try:
            await _create(auths[i % len(auths)], sessions[i % len(auths)], i, idempotency_key=f"race-{i}")
            return 1
        except QuotaExceeded as exc:
            refused.append(exc.data)
            return 0

    async def race() -> int:
        return sum(await asyncio.gather(*(one(i) for i in range(total))))

    calls = {"n": 0}
    real = dbwrites.run

    async def counted(fn: Any, /, **kwargs: Any) -> Any:
        calls["n"] += 1
        return await real(fn, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dbwrites, "run", counted)
        created = run_closing(race)
    connections.close_all()
    return created, refused, calls["n"]


def _live(tenant_id: int, principal_id: int | None = None) -> int:
    rows = Task.objects.filter(tenant_id=tenant_id).exclude(status__in=["completed", "failed", "cancelled"])
    return rows.filter(principal_id=principal_id).count() if principal_id else rows.count()


def test_200_creations_at_once_against_a_tenant_limit_of_10() -> None:
    tenant = Tenant.objects.create(slug="one-stmt-10", max_concurrent_tasks=10)
    auths = [make_auth(tenant) for _ in range(4)]
    created, refused, orm_calls = _race(auths)
    assert created == 10 and len(refused) == 190
    assert all(r == {"limit": 10, "scope": "tenant"} for r in refused)
    assert orm_calls == 190  # every refusal is decided (and named) by the ORM path, no creation
    tenant.refresh_from_db()
    assert tenant.active_tasks == _live(tenant.pk) == 10
    for auth in auths:
        assert Principal.objects.get(pk=auth.principal_id).active_tasks == _live(tenant.pk, auth.principal_id)
    assert AuditEvent.objects.filter(tenant_id=tenant.pk, action="task.create").count() == 10


def test_200_creations_at_once_against_a_principal_limit_of_10() -> None:
    tenant = Tenant.objects.create(slug="one-stmt-10p", max_concurrent_tasks_per_principal=10)
    auths = [make_auth(tenant) for _ in range(4)]
    created, refused, _ = _race(auths)
    assert created == 40 and len(refused) == 160
    assert all(r == {"limit": 10, "scope": "principal"} for r in refused)
    for auth in auths:
        assert Principal.objects.get(pk=auth.principal_id).active_tasks == _live(tenant.pk, auth.principal_id) == 10
    tenant.refresh_from_db()
    assert tenant.active_tasks == _live(tenant.pk) == 40


def test_a_tenant_without_limits_is_created_while_its_row_is_locked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another transaction holds the tenant's and principal's rows; 20 creations finish within
    a 1 s lock timeout, in one statement each, and count nothing."""
    tenant = Tenant.objects.create(slug="one-stmt-free")
    auth = make_auth(tenant)
    session = make_session(auth)
    effective_limits(tenant_id=tenant.pk)
    orm = _OrmCalls(monkeypatch)
    real = async_sql.conninfo
    monkeypatch.setattr(async_sql, "conninfo", lambda: {**real(), "options": "-c lock_timeout=1000"})
    with counter_rows_held(tenant_id=tenant.pk, principal_id=auth.principal_id):
        tasks = run_closing(lambda: asyncio.gather(*(_create(auth, session, i) for i in range(20))))
    assert len({t.task_id for t in tasks}) == 20 and orm.calls == 0
    tenant.refresh_from_db()
    assert tenant.active_tasks == 0 and _live(tenant.pk) == 20


def test_an_initialize_in_progress_holds_up_none_of_the_principals_creations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a session locks the principal's row to count its sessions. FOR UPDATE, that lock
    made the principal's creations meanwhile leave the shared statement (their foreign key check
    would wait for it) and wait on the ORM path until the initialize committed."""
    import threading

    from mcptasks.tasks import sessions

    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)
    counting, release = threading.Event(), threading.Event()
    real_live = sessions.live_sessions

    def slow_live(**kwargs: Any) -> Any:
        counting.set()
        release.wait(10)  # the principal's row is locked meanwhile
        return real_live(**kwargs)

    monkeypatch.setattr(sessions, "live_sessions", slow_live)

    def initialize() -> None:
        try:
            sessions.open_session(auth=auth, protocol_version="2025-11-25", client_info={}, capabilities={})
        finally:
            connections.close_all()

    opener = threading.Thread(target=initialize)
    opener.start()
    try:
        assert counting.wait(10)
        orm = _OrmCalls(monkeypatch)
        tasks = run_closing(lambda: asyncio.gather(*(_create(auth, session, i) for i in range(8))))
        held_throughout = not release.is_set() and opener.is_alive()
    finally:
        release.set()
        opener.join(30)
    assert len({t.task_id for t in tasks}) == 8
    assert held_throughout and orm.calls == 0


def test_a_broken_connection_fails_an_unkeyed_creation_instead_of_repeating_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The statement may have committed before the connection broke: without a key, making it
    again through the ORM could create the task twice, so the caller gets a 503-class error."""
    from django.db import OperationalError

    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)

    async def broken(sql: str, params: Any, **_kw: Any) -> Any:
        raise async_sql.Unavailable

    monkeypatch.setattr(write_conns, "execute", broken)
    with pytest.raises(OperationalError):
        run_closing(lambda: _create(auth, session, 1))
    # With a key the ORM path makes it (a committed first attempt would be returned, not repeated).
    orm = _OrmCalls(monkeypatch)
    task = run_closing(lambda: _create(auth, session, 2, idempotency_key="k"))
    assert orm.calls == 1 and Task.objects.filter(pk=task.pk).exists()


def test_a_tenant_whose_limits_are_not_cached_takes_the_orm_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its ttl bounds are not known without a read: the ORM path reads (and caches) them."""
    auth = make_auth()
    session = make_session(auth)
    clear_limits_cache()
    orm = _OrmCalls(monkeypatch)
    task = run_closing(lambda: _create(auth, session, 1))
    assert orm.calls == 1 and Task.objects.filter(pk=task.pk).exists()


def test_the_write_pool_is_reported_in_metrics(settings: Any) -> None:
    """``mcptasks_db_connections_open{pool="async_writes"}`` counts the pool's connections, and
    its bound is ``WRITE_THREADS``."""
    from asgiref.sync import sync_to_async
    from django.test import Client

    settings.DEBUG = True  # loopback scrapes without a token
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": "", "WRITE_THREADS": 3}
    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)

    async def create_and_scrape() -> str:
        await _create(auth, session, 1)
        assert write_conns.open_connections() >= 1
        response = await sync_to_async(Client(REMOTE_ADDR="127.0.0.1").get)("/metrics")
        return str(response.content.decode())

    text = run_closing(create_and_scrape)
    assert 'mcptasks_db_pool_max_connections{pool="async_writes"} 3.0' in text
    assert 'mcptasks_db_connections_open{pool="async_writes"} 0.0' not in text
    assert write_conns.open_connections() == 0


def test_the_pool_of_an_event_loop_that_closed_lets_its_connections_go() -> None:
    """A server keeps one event loop; ``async_to_sync`` and tests make one per call. A pool
    refers to its loop, so neither would ever be collected: its connections are closed once
    the loop has closed (the next pool made, or a metrics scrape, sweeps)."""
    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)

    async def create_and_leave_open() -> list[Any]:
        await _create(auth, session, 1)
        return [c for opened in write_conns._opened.values() for c in opened]

    conns = asyncio.run(create_and_leave_open())  # no write_conns.close(): the loop just ends
    assert conns and not any(c.closed for c in conns)
    assert write_conns.open_connections() == 0
    assert all(c.closed for c in conns)


def test_a_refused_statement_goes_to_the_orm_and_keeps_the_async_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A statement the database refuses (here a division by zero standing for bad data) was
    rolled back on a healthy connection: the ORM path makes the task, and the async path stays
    on for every other request (one request's input must not switch the process to the ORM)."""
    from mcptasks.models import creationsql

    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)
    real = creationsql._build

    def failing(**kwargs: Any) -> Any:
        sql, *rest = real(**kwargs)
        return (sql + ", (SELECT 1 / (SELECT count(*) FROM created WHERE false))", *rest)

    monkeypatch.setattr(creationsql, "_build", failing)
    orm = _OrmCalls(monkeypatch)
    task = run_closing(lambda: _create(auth, session, 1))
    assert orm.calls == 1 and Task.objects.filter(pk=task.pk).exists()
    assert async_sql.available()


def test_field_values_are_prepared_as_django_prepares_them() -> None:
    """The creation statement skips ``get_db_prep_save`` where it returns the value itself
    (``creationsql.db_value``): for every column of a task and its audit event, and values of
    the right type, the wrong type, None and naive datetimes, both give the same parameter."""
    import datetime as dt

    from psycopg.types.json import Jsonb

    from mcptasks.models import creationsql

    conn = connections["default"]
    aware = dt.datetime(2026, 11, 29, 3, 21, 11, 513000, tzinfo=dt.UTC)
    samples: list[Any] = [None, "", "text", 0, 7, 2**40, True, False, aware, aware.replace(tzinfo=None),
                          {"a": 1}, [1, "x"], 1.5]

    def prepared(fn: Any) -> Any:
        try:
            value = fn()
        except Exception as exc:  # both must refuse alike
            return ("raised", type(exc))
        return ("jsonb", value.obj) if isinstance(value, Jsonb) else (type(value), value)

    checked = 0
    for model in (Task, AuditEvent):
        for field in model._meta.concrete_fields:
            for value in samples:
                with pytest.warns(RuntimeWarning) if _warns(field, value) else _no_warning():
                    ours = prepared(lambda: creationsql.db_value(field, value, conn))
                with pytest.warns(RuntimeWarning) if _warns(field, value) else _no_warning():
                    django = prepared(lambda: field.get_db_prep_save(value, conn))
                assert ours == django, (model.__name__, field.name, value)
                checked += 1
    assert checked == len(samples) * (len(Task._meta.concrete_fields) + len(AuditEvent._meta.concrete_fields))


def _warns(field: Any, value: Any) -> bool:
    """Django warns when a naive datetime is saved to a DateTimeField (time zones on)."""
    import datetime as dt

    from django.db import models

    return isinstance(field, models.DateTimeField) and isinstance(value, dt.datetime) and value.tzinfo is None


def _no_warning() -> Any:
    import contextlib

    return contextlib.nullcontext()
