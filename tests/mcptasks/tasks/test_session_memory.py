"""A task creation on a session this process read live before: no read of the session, and
the creation statement itself checks that the session is still the caller's live one.

:func:`mcptasks.tasks.session_memory.remembered_session` hands out a session as this process last
read it. These tests hold what may be done with it to what a read session allows: a session
ended or deleted since (by another process, which this one cannot hear of) gets no task, another
principal's id is not served from memory, and a counted tenant's creation reads the session
first.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from mcptasks.db import async_sql
from mcptasks.db import write_pool as dbwrites
from mcptasks.models import McpSession, Task
from mcptasks.tasks import creation, selectors, session_memory
from tenants.models import Tenant
from tenants.selectors import clear_limits_cache, effective_limits
from tests.support.async_db import run_closing
from tests.support.factories import demo_tool, make_auth, make_session
from tests.support.requirements import require_postgres

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _postgres(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    require_postgres()
    async_sql._failed_until = 0.0
    settings.TENANTS = {**settings.TENANTS, "TASK_MAX_CONCURRENT": 0}
    clear_limits_cache()
    monkeypatch.setattr(session_memory, "_remembered", session_memory._RememberedSessions())


class _Counts:
    """The session reads and the ORM-path creations made meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = self.orm = 0
        read, orm = selectors.aget_session, dbwrites.run

        async def counted_read(**kwargs: Any) -> Any:
            self.reads += 1
            return await read(**kwargs)

        async def counted_orm(fn: Any, /, **kwargs: Any) -> Any:
            self.orm += 1
            return await orm(fn, **kwargs)

        monkeypatch.setattr(selectors, "aget_session", counted_read)
        monkeypatch.setattr(dbwrites, "run", counted_orm)


def _remembered(auth: Any, session: McpSession) -> McpSession:
    session_memory.remember_session(session)
    found = session_memory.remembered_session(session_id=session.pk, auth=auth)
    assert found is not None and session_memory.session_unread(found)
    return found


def _create(auth: Any, session: McpSession, n: int) -> Any:
    return creation.acreate_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1},
                                 request_id=n, progress_token=None)


def test_a_live_remembered_session_is_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)
    counts = _Counts(monkeypatch)
    task = run_closing(lambda: _create(auth, _remembered(auth, session), 1))
    assert (counts.reads, counts.orm) == (0, 0), "one statement, no read of the session"
    assert Task.objects.get(pk=task.pk).session_id == session.pk


@pytest.mark.parametrize("gone", ["ended", "deleted"])
def test_a_session_gone_elsewhere_gets_no_task_from_its_remembered_copy(
        monkeypatch: pytest.MonkeyPatch, gone: str) -> None:
    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)
    remembered = _remembered(auth, session)
    # Another process ends (DELETE) or cleans the session up: this one is not told.
    if gone == "ended":
        McpSession.objects.filter(pk=session.pk).update(ended_at=timezone.now())
    else:
        McpSession.objects.filter(pk=session.pk).delete()
    counts = _Counts(monkeypatch)
    with pytest.raises(session_memory.SessionGone):
        run_closing(lambda: _create(auth, remembered, 1))
    assert not Task.objects.filter(session_id=session.pk).exists()
    assert counts.orm == 0 and counts.reads == 1, "the statement wrote nothing; the session was read to decide"


def test_in_a_shared_batch_only_the_gone_sessions_creations_are_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    live_auth, gone_auth = make_auth(), make_auth()
    live, gone = make_session(live_auth), make_session(gone_auth)
    for a in (live_auth, gone_auth):
        effective_limits(tenant_id=a.tenant_id)
    live_copy, gone_copy = _remembered(live_auth, live), _remembered(gone_auth, gone)
    McpSession.objects.filter(pk=gone.pk).update(ended_at=timezone.now())
    counts = _Counts(monkeypatch)

    async def race() -> list[Any]:
        return await asyncio.gather(*(_create(live_auth, live_copy, i) if i % 2 else _create(gone_auth, gone_copy, i)
                                      for i in range(20)), return_exceptions=True)

    outcomes = run_closing(race)
    connections.close_all()
    made = [o for o in outcomes if isinstance(o, Task)]
    refused = [o for o in outcomes if isinstance(o, session_memory.SessionGone)]
    assert (len(made), len(refused)) == (10, 10), outcomes
    assert Task.objects.filter(session_id=live.pk).count() == 10
    assert not Task.objects.filter(session_id=gone.pk).exists()
    assert counts.orm == 0


def test_a_counted_tenant_reads_a_remembered_session_first(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = make_auth()
    Tenant.objects.filter(pk=auth.tenant_id).update(max_concurrent_tasks=5)
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)
    remembered = _remembered(auth, session)
    McpSession.objects.filter(pk=session.pk).update(ended_at=timezone.now())
    counts = _Counts(monkeypatch)
    with pytest.raises(session_memory.SessionGone):
        run_closing(lambda: _create(auth, remembered, 1))
    assert counts.reads == 1 and counts.orm == 0
    assert Tenant.objects.get(pk=auth.tenant_id).active_tasks == 0, "no slot taken for it"
    assert not Task.objects.filter(session_id=session.pk).exists()


def test_only_the_owners_initialized_sessions_are_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = make_auth()
    session = make_session(auth)
    session_memory.remember_session(session)
    same_tenant = make_auth(Tenant.objects.get(pk=auth.tenant_id))
    assert session_memory.remembered_session(session_id=session.pk, auth=same_tenant) is None
    assert session_memory.remembered_session(session_id=session.pk, auth=make_auth()) is None
    fresh = McpSession.objects.create(tenant_id=auth.tenant_id, principal_id=auth.principal_id,
                                      protocol_version="2025-11-25", initialized=False)
    era2026 = McpSession.objects.create(tenant_id=auth.tenant_id, principal_id=auth.principal_id,
                                        protocol_version="2026-07-28", initialized=True)
    for other in (fresh, era2026):
        session_memory.remember_session(other)
        assert session_memory.remembered_session(session_id=other.pk, auth=auth) is None
    found = session_memory.remembered_session(session_id=session.pk, auth=auth)
    assert found is not None and found.pk == session.pk and found.protocol_version == "2025-11-25"
    session_memory.forget_session(session.pk)
    assert session_memory.remembered_session(session_id=session.pk, auth=auth) is None


def test_what_is_remembered_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_memory._RememberedSessions, "SIZE", 3)
    auth = make_auth()
    sessions = [make_session(auth) for _ in range(5)]
    for s in sessions:
        session_memory.remember_session(s)
    assert list(session_memory._remembered.rows) == [s.pk for s in sessions[2:]]


def test_what_a_client_sizes_is_not_remembered() -> None:
    """A session's client info and capabilities take up to a request body each: 10,000 of them
    would be gigabytes. A creation reads neither, so neither is kept."""
    auth = make_auth()
    session = make_session(auth)
    session.client_info = {"name": "x" * 100_000, "version": "1"}
    session_memory.remember_session(session)
    kept = session_memory._remembered.rows[session.pk]
    assert sum(len(v) for v in kept if isinstance(v, str)) < 1_000
    found = session_memory.remembered_session(session_id=session.pk, auth=auth)
    assert found is not None
    assert {"client_info", "client_capabilities", "subscriptions"} <= found.get_deferred_fields()
