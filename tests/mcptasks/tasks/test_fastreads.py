"""Reads without a thread hop (async psycopg) answer exactly what the ORM selectors answer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from mcptasks.db import async_sql as fastreads
from mcptasks.models import McpSession, Task, TaskMessage
from mcptasks.protocol.errors import McpError
from mcptasks.tasks import selectors
from tests.support.factories import expire, make_auth, make_session, make_task
from tests.support.requirements import require_postgres

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgres() -> None:
    require_postgres()
    fastreads._failed_until = 0.0


def _both(fn_sync: Any, fn_async: Any, **kwargs: Any) -> tuple[Any, Any]:
    """(ORM answer, async answer), each a value or the McpError message."""

    def run(call: Any) -> Any:
        try:
            return call(**kwargs)
        except McpError as exc:
            return exc.message

    async def via_async(**kw: Any) -> Any:
        assert fastreads.available(), "the async path should be taken here"
        try:
            return await fn_async(**kw)
        finally:
            await fastreads.close()

    return run(fn_sync), run(async_to_sync(via_async))


def test_tasks_are_scoped_like_the_orm_selector() -> None:
    owner = make_auth()
    task = make_task(owner)
    neighbour = make_auth(tenant=None)  # another tenant
    colleague = make_auth(tenant=_tenant_of(owner))  # same tenant, another principal
    admin = make_auth(tenant=_tenant_of(owner), scopes="mcp:tools mcp:tasks mcp:tasks:tenant")
    for auth in (owner, neighbour, colleague, admin):
        for task_id in (task.task_id, "no-such-task"):
            orm, fast = _both(selectors.get_task, selectors.aget_task, auth=auth, task_id=task_id)
            if isinstance(orm, Task):
                assert isinstance(fast, Task) and fast.pk == orm.pk and fast.wire() == orm.wire()
                assert fast.params == orm.params and fast.status == orm.status
            else:
                assert fast == orm, (auth, task_id)
    assert _both(selectors.get_task, selectors.aget_task, auth=colleague, task_id=task.task_id)[1] == (
        "Failed to retrieve task: Task not found"
    )
    expire(task)
    orm, fast = _both(selectors.get_task, selectors.aget_task, auth=owner, task_id=task.task_id)
    assert fast == orm and "expired" in str(orm).lower()


def _status_only(auth: Any, task: Task) -> Task:
    """``aget_task(status_only=True)`` from sync test code."""

    async def read() -> Task:
        try:
            return await selectors.aget_task(auth=auth, task_id=task.task_id, status_only=True)
        finally:
            await fastreads.close()

    return async_to_sync(read)()


def test_status_only_reads_leave_payloads_unloaded() -> None:
    owner = make_auth()
    task = make_task(owner)
    fast = _status_only(owner, task)
    assert fast.wire() == Task.objects.get(pk=task.pk).wire()
    assert {"params", "result", "error"} <= fast.get_deferred_fields()


def test_sessions_are_scoped_like_the_orm_selector() -> None:
    owner = make_auth()
    live = make_session(owner)
    ended = make_session(owner)
    McpSession.objects.filter(pk=ended.pk).update(ended_at=timezone.now())
    stranger = make_auth(tenant=_tenant_of(owner))
    for auth in (owner, stranger):
        for sid in (live.pk, ended.pk, "no-such-session"):
            orm, fast = _both(selectors.get_session, selectors.aget_session, auth=auth, session_id=sid)
            assert (orm.pk if orm else None) == (fast.pk if fast else None), (auth, sid)
    orm, fast = _both(selectors.get_session, selectors.aget_session, auth=owner, session_id=live.pk)
    assert fast.protocol_version == orm.protocol_version and fast.initialized is orm.initialized


def test_session_and_task_in_one_read_match_the_separate_selectors() -> None:
    """Every mix of a present/absent/foreign session and task: the same answers as two reads."""
    owner = make_auth()
    live, task = make_session(owner), make_task(owner)
    ended = make_session(owner)
    McpSession.objects.filter(pk=ended.pk).update(ended_at=timezone.now())
    colleague = make_auth(tenant=_tenant_of(owner))
    their_session = make_session(colleague)
    neighbour = make_auth(tenant=None)

    async def read(auth: Any, sid: str, task_id: str, status_only: bool) -> Any:
        try:
            return await selectors.aget_session_and_task(
                session_id=sid, auth=auth, task_id=task_id, status_only=status_only
            )
        finally:
            await fastreads.close()

    cases = 0
    for auth in (owner, colleague, neighbour):
        for sid in (live.pk, ended.pk, their_session.pk, "no-such-session"):
            for task_id in (task.task_id, "no-such-task"):
                for status_only in (True, False):
                    both = async_to_sync(read)(auth, sid, task_id, status_only)
                    assert both is not None, "the one-read path should be taken here"
                    session = selectors.get_session(session_id=sid, auth=auth)
                    assert (both.session.pk if both.session else None) == (session.pk if session else None)
                    try:
                        expected: Any = selectors.get_task(auth=auth, task_id=task_id)
                    except McpError as exc:
                        expected = exc.message
                    try:
                        got: Any = selectors.visible_task(both.task)
                    except McpError as exc:
                        got = exc.message
                    if isinstance(expected, Task):
                        assert got.pk == expected.pk and got.wire() == expected.wire()
                        deferred = got.get_deferred_fields()
                        assert ({"params", "result", "error"} <= deferred) if status_only else not deferred
                    else:
                        assert got == expected
                    cases += 1
    assert cases == 48


def test_task_listing_pages_match_the_orm_selector() -> None:
    """Every page (scoping, expiry, order, cursors) is what ``list_tasks`` answers."""
    owner = make_auth()
    colleague = make_auth(tenant=_tenant_of(owner))
    admin = make_auth(tenant=_tenant_of(owner), scopes="mcp:tools mcp:tasks mcp:tasks:tenant")
    neighbour = make_auth(tenant=None)
    mine = [make_task(owner) for _ in range(5)]
    theirs = [make_task(colleague) for _ in range(2)]
    expire(mine[1])

    async def pages(auth: Any, page_size: int) -> list[tuple[list[str], str | None]]:
        out, cursor = [], None
        assert fastreads.available(), "the async path should be taken here"
        try:
            while True:
                page = await selectors.alist_tasks(auth=auth, cursor=cursor, page_size=page_size)
                assert all({"params", "result", "error"} <= t.get_deferred_fields() for t in page.tasks)
                out.append(([t.task_id for t in page.tasks], page.next_cursor))
                if page.next_cursor is None:
                    return out
                cursor = page.next_cursor
        finally:
            await fastreads.close()

    def orm_pages(auth: Any, page_size: int) -> list[tuple[list[str], str | None]]:
        out, cursor = [], None
        while True:
            page = selectors.list_tasks(auth=auth, cursor=cursor, page_size=page_size)
            out.append(([t.task_id for t in page.tasks], page.next_cursor))
            if page.next_cursor is None:
                return out
            cursor = page.next_cursor

    # Cursors carry no timestamp, so both paths must give the very same text.
    for auth in (owner, colleague, admin, neighbour):
        for page_size in (1, 2, 50):
            assert async_to_sync(pages)(auth, page_size) == orm_pages(auth, page_size), (
                auth,
                page_size,
            )
    listed = [tid for ids, _ in async_to_sync(pages)(admin, 2) for tid in ids]
    assert sorted(listed) == sorted(t.task_id for t in [*mine, *theirs] if t.pk != mine[1].pk)
    # Someone else's cursor is refused, as by the ORM selector.
    first = selectors.list_tasks(auth=owner, cursor=None, page_size=1).next_cursor

    async def with_cursor() -> str:
        try:
            await selectors.alist_tasks(auth=colleague, cursor=first, page_size=1)
        except McpError as exc:
            return exc.message
        finally:
            await fastreads.close()
        return "accepted"

    assert "Invalid cursor" in async_to_sync(with_cursor)()


def test_a_failing_async_connection_falls_back_to_the_orm(monkeypatch: pytest.MonkeyPatch) -> None:
    owner = make_auth()
    task = make_task(owner)
    real = fastreads.conninfo
    monkeypatch.setattr(fastreads, "conninfo", lambda: {**real(), "port": 1})

    async def read() -> Task:
        try:
            return await selectors.aget_task(auth=owner, task_id=task.task_id)
        finally:
            await fastreads.close()

    assert async_to_sync(read)().pk == task.pk  # answered by the ORM
    assert not fastreads.available(), "the async path rests after a failure"


def _tenant_of(auth: Any) -> Any:
    from tenants.models import Tenant

    return Tenant.objects.get(pk=auth.tenant_id)


def _read_at_once(monkeypatch: pytest.MonkeyPatch, reads: list[Any]) -> tuple[list[int], list[Any]]:
    """Await ``reads`` (coroutines) together on one event loop: (the parameter count of each
    statement they sent, their answers)."""
    statements: list[int] = []
    real_read = fastreads._read

    async def counting_read(sql: str, params: Any, *, all_rows: bool) -> Any:
        statements.append(len(params))
        return await real_read(sql, params, all_rows=all_rows)

    monkeypatch.setattr(fastreads, "_read", counting_read)

    async def read_all() -> list[Any]:
        try:
            return list(await asyncio.gather(*reads))
        finally:
            await fastreads.close()

    return statements, async_to_sync(read_all)()


def test_concurrent_pair_reads_are_batched_and_each_gets_its_own_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads made at the same time share one statement, and each still gets exactly its own
    session and task under its own scoping (a batch mixing tenants leaks nothing)."""
    owner = make_auth()
    live, task = make_session(owner), make_task(owner)
    other_task = make_task(owner)
    colleague = make_auth(tenant=_tenant_of(owner))
    their_session = make_session(colleague)
    neighbour = make_auth(tenant=None)
    neighbours_session, neighbours_task = make_session(neighbour), make_task(neighbour)
    cases = [
        (auth, sid, task_id)
        for auth in (owner, colleague, neighbour)
        for sid in (live.pk, their_session.pk, neighbours_session.pk, "no-such-session")
        for task_id in (task.task_id, other_task.task_id, neighbours_task.task_id, "no-such-task")
    ]
    statements, answers = _read_at_once(monkeypatch, [
        selectors.aget_session_and_task(session_id=sid, auth=auth, task_id=tid, status_only=False)
        for auth, sid, tid in cases
    ])
    assert len(statements) < len(cases) / 4, statements  # batched: far fewer statements than reads
    for (auth, sid, task_id), both in zip(cases, answers, strict=True):
        assert both is not None
        session = selectors.get_session(session_id=sid, auth=auth)
        assert (both.session.pk if both.session else None) == (session.pk if session else None)
        try:
            expected: Any = selectors.get_task(auth=auth, task_id=task_id).pk
        except McpError as exc:
            expected = exc.message
        try:
            got: Any = selectors.visible_task(both.task).pk
        except McpError as exc:
            got = exc.message
        assert got == expected, (auth, sid, task_id)


def test_concurrent_session_reads_are_batched_and_each_gets_its_own_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session read of every ``tools/call`` (``aget_session``) shares a statement with the
    concurrent ones: each caller still gets exactly its own live session, and another
    principal's, an ended or a missing one is None, as from the ORM selector."""
    from django.utils import timezone

    owner = make_auth()
    live = make_session(owner)
    ended = make_session(owner)
    McpSession.objects.filter(pk=ended.pk).update(ended_at=timezone.now())
    colleague = make_auth(tenant=_tenant_of(owner))
    their_session = make_session(colleague)
    neighbour = make_auth(tenant=None)
    neighbours_session = make_session(neighbour)
    cases = [(auth, sid) for auth in (owner, colleague, neighbour)
             for sid in (live.pk, ended.pk, their_session.pk, neighbours_session.pk, "no-such-session")] * 3
    statements, answers = _read_at_once(
        monkeypatch, [selectors.aget_session(session_id=sid, auth=auth) for auth, sid in cases])
    assert len(statements) < len(cases) / 4, statements  # batched: far fewer statements than reads
    for (auth, sid), got in zip(cases, answers, strict=True):
        expected = selectors.get_session(session_id=sid, auth=auth)
        assert (got.pk if got else None) == (expected.pk if expected else None), (auth, sid)
        if got is not None:
            assert (got.principal_id, got.tenant_id, got.ended_at) == (auth.principal_id, auth.tenant_id, None)


def test_instances_built_from_rows_behave_like_the_orms() -> None:
    """fastreads builds instances without ``Model.__init__``: that is only sound while the models
    have no init signals, and the instances must save, refresh and defer like the ORM's."""
    from django.db.models import signals

    from tenants.models import Tenant

    # TaskMessage: a listen's pending input requests; Tenant: the limits re-read every second.
    for model in (McpSession, Task, TaskMessage, Tenant):
        assert not signals.pre_init.has_listeners(model) and not signals.post_init.has_listeners(model)
    owner = make_auth()
    task = make_task(owner)
    fast = _status_only(owner, task)
    payload = {"params", "result", "error"}
    orm = Task.objects.only(*[f.attname for f in Task._meta.concrete_fields if f.name not in payload]).get(pk=task.pk)
    assert fast.get_deferred_fields() == orm.get_deferred_fields() == {"params", "result", "error"}
    assert not fast._state.adding and fast._state.db == "default"
    assert fast == orm and hash(fast) == hash(orm)
    assert fast.params == task.params  # a deferred field loads on access, as with the ORM
    fast.status_message = "edited"
    fast.save(update_fields=["status_message"])
    assert Task.objects.get(pk=task.pk).status_message == "edited"


def test_a_tenants_limits_are_read_as_the_orm_reads_them_and_cached() -> None:
    """``atenant_row`` (the limits re-read every second by every process) answers what the ORM
    read answers, for a tenant with limits, one without and an unknown one, and caches it."""
    from tenants import selectors as tenant_selectors
    from tenants.models import Tenant
    from tests.support.factories import make_tenant

    limited = make_tenant(max_concurrent_tasks=7, rate_read_per_min=30, max_ttl_ms=90_000)
    plain = make_tenant()
    for tenant_id in (limited.pk, plain.pk, 10**12):
        tenant_selectors.clear_limits_cache()
        orm, fast = _both(tenant_selectors.read_tenant_row, selectors.atenant_row, tenant_id=tenant_id)
        assert fast == orm
        assert tenant_selectors.cached_tenant_row(tenant_id=tenant_id) == fast  # cached as the ORM read caches
    assert fast == tenant_selectors.TenantRow()  # an unknown tenant has no limits
    Tenant.objects.filter(pk=limited.pk).update(max_concurrent_tasks=3)  # another process's edit
    _, fast = _both(tenant_selectors.read_tenant_row, selectors.atenant_row, tenant_id=limited.pk)
    assert fast.max_concurrent_tasks == 3 and fast.rate_read_per_min == 30 and fast.max_ttl_ms == 90_000
