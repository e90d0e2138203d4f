"""Task creation: one row (a task or a plain request), its quota slot and audit event, one transaction
(from async code on PostgreSQL, one statement)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import IntegrityError, OperationalError, transaction
from django.utils import timezone

from mcptasks import conf, observability
from mcptasks.db import async_sql, write_conns
from mcptasks.db import write_pool as dbwrites
from mcptasks.models import McpSession, Task, TaskStatus, creationsql, instances
from mcptasks.streams import signals
from mcptasks.tasks import auditing, idempotency, selectors, session_memory
from mcptasks.tools.registry import Tool
from tenants import quotas
from tenants.auth import AuthContext
from tenants.selectors import TaskLimits, cached_tenant_row, effective_limits, limits_of


def _new_task(
    *, auth: AuthContext, session_id: str, tool: Tool, arguments: dict[str, Any], request_id: str | int,
    progress_token: str | int | None, kind: str, requested_ttl_ms: int | None, stream_id: str | None,
    idempotency_key: str | None, limits: TaskLimits,
) -> tuple[Task, int | None]:
    """The unsaved row of a creation and its ttl (clamped to the tenant's maximum)."""
    now = timezone.now()
    if kind == Task.Kind.TASK:
        ttl = limits.default_ttl_ms if requested_ttl_ms is None else requested_ttl_ms
        # Clamped both ways: a client's ttl may be any JSON integer (2^63-1, 10^40).
        ttl = max(0, min(ttl, limits.max_ttl_ms))
        poll = limits.poll_interval_ms
    else:
        ttl = None
        poll = None
    # Built positionally (:mod:`mcptasks.models.instances`): the keyword path was most of this function.
    task = instances.build(Task, dict(
        kind=kind,
        tenant_id=auth.tenant_id,
        principal_id=auth.principal_id,
        session_id=session_id,
        status=TaskStatus.WORKING,
        method="tools/call",
        tool_name=tool.name,
        params={"name": tool.name, "arguments": arguments},
        request_id=request_id,
        progress_token=progress_token,
        ttl_ms=ttl,
        poll_interval_ms=poll,
        created_at=now,
        last_updated_at=now,
        expires_at=now + dt.timedelta(milliseconds=ttl) if ttl is not None else None,
        max_attempts=conf.get().TASK_MAX_ATTEMPTS if tool.retryable else 1,
        stream_id=stream_id,
        idempotency_key=idempotency_key,
        # The creating span, so the worker's spans join this request's trace ("" when off).
        traceparent=observability.current_traceparent(),
    ))
    return task, ttl


def create_task(
    *,
    auth: AuthContext,
    session: McpSession,
    tool: Tool,
    arguments: dict[str, Any],
    request_id: str | int,
    progress_token: str | int | None,
    kind: str = Task.Kind.TASK,
    requested_ttl_ms: int | None = None,
    stream_id: str | None = None,
    idempotency_key: str | None = None,
) -> Task:
    """Create a task (or plain request) row and wake a worker once it is committed.

    The ttl is clamped to the tenant's maximum; the quota slot is taken in the same
    transaction, so a refused creation leaves nothing behind. With an ``idempotency_key``
    (:mod:`mcptasks.tasks.idempotency`) a retry returns the task the first attempt created.
    From async code, :func:`acreate_task` makes a task in one statement.
    """
    # No look-up first: a first attempt (nearly every creation) costs no extra round trip. With an
    # idempotency key, a retry's insert hits the unique key (at once, or once a concurrent
    # duplicate commits) and rolls back before any slot or audit row is taken; it then finds
    # the first task.
    try:
        task, ttl = _new_task(
            auth=auth, session_id=session.pk, tool=tool, arguments=arguments, request_id=request_id,
            progress_token=progress_token, kind=kind, requested_ttl_ms=requested_ttl_ms, stream_id=stream_id,
            idempotency_key=idempotency_key, limits=effective_limits(tenant_id=auth.tenant_id),
        )
        with transaction.atomic():
            task.save(force_insert=True)
            if kind == Task.Kind.TASK:
                auditing.record_audit(
                    auth=auth, action="task.create", task_id=task.task_id, data={"tool": tool.name, "ttl": ttl}
                )
            # Every run takes a slot, plain calls included: they occupy workers just the same. Taken
            # last, just before the commit: the slot's UPDATE locks the tenant's row until then, and
            # every creation of the tenant waits for that lock, so it is held for as little as can
            # be. A refusal rolls the task and its audit row back with it.
            quotas.acquire_task_slot(tenant_id=auth.tenant_id, principal_id=auth.principal_id)
            transaction.on_commit(signals.wake_workers)
        return task
    except IntegrityError:
        if idempotency_key is None:
            raise
        # A duplicate committed first (if concurrent, the unique constraint made this insert
        # wait for it): answer with its task; this attempt left nothing behind.
        existing = _idempotent_match(auth=auth, key=idempotency_key, tool=tool, arguments=arguments)
        if existing is None:
            raise
        return existing


async def acreate_task(
    *,
    auth: AuthContext,
    session: McpSession,
    tool: Tool,
    arguments: dict[str, Any],
    request_id: str | int,
    progress_token: str | int | None,
    requested_ttl_ms: int | None = None,
    idempotency_key: str | None = None,
) -> Task:
    """:func:`create_task` of a task-augmented call from async code.

    On PostgreSQL the task, its audit event and its quota slot are one statement on an async
    connection (:mod:`mcptasks.db.write_conns`): one round trip, no thread hop, no lock held
    while Python runs. Whatever that statement does not settle (the tenant's limits not cached
    yet, a per-principal limit, a refusal, a retried idempotency key, the async path failing
    before anything was sent) is made by :func:`create_task` on a write thread, which decides it.

    ``session`` may be one this process remembered rather than read for this request
    (:func:`mcptasks.tasks.session_memory.remembered_session`): the uncounted statement inserts only
    while it is the caller's live session, and every other path reads it first. Raises
    :class:`~mcptasks.tasks.session_memory.SessionGone` when such a session is found gone.
    """
    kwargs: dict[str, Any] = {
        "auth": auth, "session": session, "tool": tool, "arguments": arguments, "request_id": request_id,
        "progress_token": progress_token, "requested_ttl_ms": requested_ttl_ms, "idempotency_key": idempotency_key,
    }
    # A session remembered, not read, for this request (session_memory.remembered_session): the
    # uncounted statement checks it is live as it inserts; every other path reads it first.
    unread = session_memory.session_unread(session)
    row = cached_tenant_row(tenant_id=auth.tenant_id) if write_conns.available() else None
    if row is not None:
        limits = limits_of(row)
        task, ttl = _new_task(
            auth=auth, session_id=session.pk, tool=tool, arguments=arguments, request_id=request_id,
            progress_token=progress_token, kind=Task.Kind.TASK, requested_ttl_ms=requested_ttl_ms,
            stream_id=None, idempotency_key=idempotency_key, limits=limits,
        )
        counted = limits.max_concurrent_tasks is not None or limits.max_concurrent_tasks_per_principal is not None
        if counted and unread:
            await _read_session(session=session, auth=auth)
            unread = False
        try:
            # The statement wakes the workers itself (pg_notify, delivered on commit).
            if await creationsql.insert_task(task=task, audit_data={"tool": tool.name, "ttl": ttl},
                                             fallback_limit=quotas.default_tenant_limit(), counted=counted):
                return task
        except write_conns.Refused:
            pass  # e.g. the idempotency key of an earlier attempt: the ORM path answers it
        except async_sql.Unavailable:
            if idempotency_key is None:
                # The statement may have committed: only a keyed creation can safely be made again.
                raise OperationalError("the database connection failed during the task's creation") from None
    if unread:
        # Not created by the statement, which may be because the session is gone.
        await _read_session(session=session, auth=auth)
    return await dbwrites.run(create_task, kind=Task.Kind.TASK, **kwargs)


async def _read_session(*, session: McpSession, auth: AuthContext) -> None:
    """Read ``session`` now: :class:`~mcptasks.tasks.session_memory.SessionGone` unless it is the caller's live one."""
    if await selectors.aget_session(session_id=session.pk, auth=auth) is None:
        raise session_memory.SessionGone(session.pk)


def _idempotent_match(*, auth: AuthContext, key: str, tool: Tool, arguments: dict[str, Any]) -> Task | None:
    """The task this principal created with ``key``, or None; refuses a different call."""
    task = Task.objects.filter(tenant_id=auth.tenant_id, principal_id=auth.principal_id, idempotency_key=key).first()
    if task is not None and (task.tool_name != tool.name or (task.params or {}).get("arguments") != arguments):
        raise idempotency.mismatch()
    return task
