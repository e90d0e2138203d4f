"""Reads. Every task lookup is scoped to the caller's tenant and principal."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import Q, QuerySet
from django.utils import timezone

from mcptasks import conf
from mcptasks.db import async_sql as fastreads
from mcptasks.models import McpSession, StreamEvent, Task, TaskMessage, WorkerHeartbeat
from mcptasks.protocol.errors import INVALID_PARAMS, TASK_EXPIRED, TASK_NOT_FOUND, McpError, invalid_params
from mcptasks.tasks import cursors
from tenants import auth_fingerprint
from tenants.auth import AuthContext
from tenants.models import Tenant
from tenants.selectors import TenantRow, read_tenant_row, remember_tenant_read

_CURSOR_SALT = "mcptasks.tasks.list"


def get_session(*, session_id: str, auth: AuthContext) -> McpSession | None:
    """A live session owned by the caller, or None (unknown, ended, or someone else's)."""
    return _live_session(McpSession.objects.filter(pk=session_id).first(), auth=auth)


async def aget_session(*, session_id: str, auth: AuthContext) -> McpSession | None:
    """:func:`get_session` from async code: no thread hop on PostgreSQL (see fastreads)."""
    if fastreads.available():
        with contextlib.suppress(fastreads.Unavailable):
            row = await fastreads.fetch_one_batched(McpSession, where=['"id" = %s'], params=[session_id])
            return _live_session(row, auth=auth)
    return await sync_to_async(get_session)(session_id=session_id, auth=auth)


async def atenant_row(*, tenant_id: int) -> TenantRow:
    """The tenant's limit columns read now (:func:`tenants.selectors.read_tenant_row`), from async
    code: on PostgreSQL on the event loop's connection, batched with the concurrent reads.

    Issue 27: every process re-reads each busy tenant's limits every second; through the ORM on
    a thread that was about a millisecond of Python each, holding the GIL against the event loop
    (20 tenants' re-reads, with their tokens' re-verifications, cost a web process a tenth of
    its CPU and a third of its creations).
    """
    if fastreads.available():
        with contextlib.suppress(fastreads.Unavailable):
            started = time.monotonic()
            tenant = await fastreads.fetch_one_batched(Tenant, where=['"id" = %s'], params=[tenant_id])
            return remember_tenant_read(tenant_id=tenant_id, tenant=tenant, read_at=started)
    return await sync_to_async(read_tenant_row)(tenant_id=tenant_id)


async def atoken_fingerprint(*, token: str, principal_id: int | None) -> tuple[Any, ...] | None:
    """The fingerprint of what a built-in ``token``'s verdict naming ``principal_id`` is decided
    from (:mod:`tenants.auth_fingerprint`), read on the event loop's connection; None off
    PostgreSQL, for an unknown token, or while the async connection fails (then the verdict is
    verified in full)."""
    sql = auth_fingerprint.fingerprint_sql()
    if sql is None or not fastreads.available():
        return None
    try:
        return await fastreads.fetch_row(sql, [auth_fingerprint.token_checksum(token), principal_id])
    except fastreads.Unavailable:
        return None


def _live_session(session: McpSession | None, *, auth: AuthContext) -> McpSession | None:
    if session is None or session.ended_at is not None:
        return None
    if session.principal_id != auth.principal_id or session.tenant_id != auth.tenant_id:
        # Another principal's session is indistinguishable from a missing one.
        return None
    return session


def _sees_whole_tenant(auth: AuthContext) -> bool:
    return auth.has_scope("mcp:tasks:tenant") and not auth.anonymous


def _task_scope(*, auth: AuthContext) -> dict[str, Any]:
    """The conditions of every task read, by field: the caller's tenant, tasks (not plain
    requests), and the caller's own unless it may see the whole tenant. The ORM and the async
    reads both build on it."""
    scope: dict[str, Any] = {"tenant_id": auth.tenant_id, "kind": Task.Kind.TASK.value}
    if not _sees_whole_tenant(auth):
        scope["principal_id"] = auth.principal_id
    return scope


def _task_queryset(*, auth: AuthContext) -> Any:
    return Task.objects.filter(**_task_scope(auth=auth))


def _task_where(*, auth: AuthContext, **extra: Any) -> tuple[list[str], list[Any]]:
    """:func:`_task_scope` and ``extra`` (field=value) as SQL conditions and parameters (fastreads)."""
    conditions = {**_task_scope(auth=auth), **extra}
    return [f'"{_TASK_COLUMNS[name]}" = %s' for name in conditions], list(conditions.values())


#: Task column names by field attname (built once: _task_where runs on every tasks/get).
_TASK_COLUMNS = {f.attname: f.column for f in Task._meta.concrete_fields}


def get_task(*, auth: AuthContext, task_id: str, now: dt.datetime | None = None) -> Task:
    """The caller's task or -32602 (not found, someone else's, or expired)."""
    return _visible_task(_task_queryset(auth=auth).filter(task_id=task_id).first(), now=now)


def get_run(*, auth: AuthContext, task_id: str, kind: str) -> Task:
    """The caller's own task or plain run, or -32602 (missing, someone else's, expired).

    Unlike :func:`get_task` this also finds plain runs (``kind=request``), which only their
    principal ever continues, so it is always scoped to the principal (2026-07-28 rounds).
    """
    return _visible_task(Task.objects.filter(
        task_id=task_id, kind=kind, tenant_id=auth.tenant_id, principal_id=auth.principal_id
    ).first())


#: Fields a task's status (``Task.wire()``) never reads: not loaded by ``aget_task(status_only=True)``.
_PAYLOAD_FIELDS = ("params", "result", "error")


async def aget_task(*, auth: AuthContext, task_id: str, status_only: bool = False) -> Task:
    """:func:`get_task` from async code: no thread hop on PostgreSQL (see fastreads).

    ``status_only`` leaves the arguments, result and error unloaded (deferred): for callers that
    only answer with the task's status.
    """
    if fastreads.available():
        where, params = _task_where(auth=auth, task_id=task_id)
        with contextlib.suppress(fastreads.Unavailable):
            row = await fastreads.fetch_one(
                Task, where=where, params=params, skip=_PAYLOAD_FIELDS if status_only else ()
            )
            return _visible_task(row)
    return await sync_to_async(get_task)(auth=auth, task_id=task_id)


async def alive_tasks(*, auth: AuthContext, task_ids: list[str]) -> list[Task]:
    """The caller's unexpired tasks among ``task_ids`` (any order), in one read.

    Scoped as :func:`get_task`; unknown, foreign and expired ids are simply absent. No thread
    hop on PostgreSQL (fastreads), the ORM in a thread otherwise.
    """
    task_ids = list(dict.fromkeys(task_ids))
    if not task_ids:
        return []
    now = timezone.now()
    if fastreads.available():
        where, params = _task_where(auth=auth)
        with contextlib.suppress(fastreads.Unavailable):
            rows = await fastreads.fetch_many(
                Task, where=[*where, '"task_id" = ANY(%s)'], params=[*params, task_ids],
                order_by='"seq"', limit=len(task_ids))
            return [t for t in rows if not is_expired(t, now=now)]
    rows = await sync_to_async(lambda: list(_task_queryset(auth=auth).filter(task_id__in=task_ids)))()
    return [t for t in rows if not is_expired(t, now=now)]


@dataclass(frozen=True)
class SessionAndTask:
    """:func:`aget_session_and_task`'s answer: the session (None: not the caller's live one) and,
    read in the same round trip, the task to be served (None: not visible; a handler applies
    :func:`visible_task` to it, after the session was checked)."""

    session: McpSession | None
    task_id: str
    task: Task | None
    status_only: bool


async def aget_session_and_task(
    *, session_id: str, auth: AuthContext, task_id: str, status_only: bool
) -> SessionAndTask | None:
    """The session and the task a ``tasks/get``/``tasks/result`` names, in one database round trip.

    None when that path is not available (SQLite, async reads off or failing): callers then read
    each with :func:`aget_session` and :func:`aget_task`.
    """
    if not fastreads.available():
        return None
    where, params = _task_where(auth=auth, task_id=task_id)
    try:
        session, task = await fastreads.fetch_pair(
            (McpSession, ['"id" = %s'], [session_id]),
            (Task, where, params, _PAYLOAD_FIELDS if status_only else ()),
        )
    except fastreads.Unavailable:
        return None
    return SessionAndTask(
        session=_live_session(session, auth=auth), task_id=task_id, task=task, status_only=status_only
    )


def visible_task(task: Task | None) -> Task:
    """The task, or -32602 if it is missing (not found, someone else's) or expired."""
    return _visible_task(task)


def _visible_task(task: Task | None, *, now: dt.datetime | None = None) -> Task:
    if task is None:
        raise McpError(INVALID_PARAMS, TASK_NOT_FOUND)
    if is_expired(task, now=now):
        raise McpError(INVALID_PARAMS, TASK_EXPIRED)
    return task


def is_expired(task: Task, *, now: dt.datetime | None = None) -> bool:
    """Whether the task's ttl has elapsed (it answers 'expired' until cleanup deletes it)."""
    return task.expires_at is not None and task.expires_at <= (now or timezone.now())


@dataclass(frozen=True)
class TaskPage:
    """One page of ``tasks/list``."""

    tasks: list[Task]
    next_cursor: str | None


def list_tasks(*, auth: AuthContext, cursor: str | None, page_size: int) -> TaskPage:
    """Keyset pagination, newest first, over the caller's unexpired tasks.

    The cursor is the last ``seq`` seen, signed and bound to the principal, so it is opaque and
    tamper-proof. Rows are ordered by a unique key, so no task appears twice and none that
    existed when paging started is skipped, however many are created meanwhile.
    """
    qs = _task_queryset(auth=auth).filter(Q(expires_at__gt=timezone.now()) | Q(expires_at__isnull=True))
    if cursor is not None:
        qs = qs.filter(seq__lt=_decode_cursor(cursor, auth=auth))
    return _page(list(qs.order_by("-seq")[: page_size + 1]), page_size=page_size, auth=auth)


async def alist_tasks(*, auth: AuthContext, cursor: str | None, page_size: int) -> TaskPage:
    """:func:`list_tasks` from async code: no thread hop on PostgreSQL (see fastreads).

    The rows leave the arguments, result and error unloaded: a listing shows each task's status.
    """
    if fastreads.available():
        where, params = _task_where(auth=auth)
        where.append('("expires_at" > %s OR "expires_at" IS NULL)')
        params.append(timezone.now())
        if cursor is not None:
            where.append('"seq" < %s')
            params.append(_decode_cursor(cursor, auth=auth))
        with contextlib.suppress(fastreads.Unavailable):
            rows = await fastreads.fetch_many(
                Task, where=where, params=params, order_by='"seq" DESC', limit=page_size + 1, skip=_PAYLOAD_FIELDS
            )
            return _page(rows, page_size=page_size, auth=auth)
    return await sync_to_async(list_tasks)(auth=auth, cursor=cursor, page_size=page_size)


def _page(rows: list[Task], *, page_size: int, auth: AuthContext) -> TaskPage:
    next_cursor = None
    if len(rows) > page_size:
        rows = rows[:page_size]
        next_cursor = _encode_cursor(rows[-1].seq, auth=auth)
    return TaskPage(rows, next_cursor)


def _encode_cursor(seq: int, *, auth: AuthContext) -> str:
    return cursors.sign({"s": seq, "p": auth.principal_id}, salt=_CURSOR_SALT)


def _decode_cursor(cursor: str, *, auth: AuthContext) -> int:
    data = cursors.read(cursor, salt=_CURSOR_SALT)
    if data.get("p") != auth.principal_id or not isinstance(data.get("s"), int):
        raise invalid_params("Invalid cursor")
    return int(data["s"])


def pending_input(*, task_ids: list[int]) -> QuerySet[TaskMessage]:
    """The input requests (server->client requests) of the tasks ``task_ids`` (pks) that the
    client has not answered yet, oldest first per task: the one definition of "pending input"."""
    return TaskMessage.objects.filter(task_id__in=task_ids, answered_at__isnull=True).order_by("task_id", "id")


async def apending_input(*, task_ids: list[int]) -> list[TaskMessage]:
    """:func:`pending_input` from async code: no thread hop on PostgreSQL (see fastreads).

    Only committed rows are read on the fast path; the ORM in a thread otherwise, or while that
    path fails.
    """
    if not task_ids:
        return []
    if fastreads.available():
        with contextlib.suppress(fastreads.Unavailable):
            return await fastreads.fetch_many(
                TaskMessage, where=['"task_id" = ANY(%s)', '"answered_at" IS NULL'], params=[task_ids],
                order_by='"task_id", "id"', limit=_ALL_ROWS)
    return await sync_to_async(lambda: list(pending_input(task_ids=task_ids)))()


#: "Every row" for a fast read that needs a limit (a task's outstanding requests are few).
_ALL_ROWS = 2**31 - 1


def pending_messages(*, task: Task) -> list[TaskMessage]:
    """Server->client requests of a task that the client has not answered yet (oldest first)."""
    return list(pending_input(task_ids=[task.pk]))


def message_answer(*, message_pk: int) -> Any:
    """``{"response", "answered_at"}`` of one input request (None: it was dropped with its task's
    run); what a tool waiting for its client polls."""
    return TaskMessage.objects.filter(pk=message_pk).values("response", "answered_at").first()


def session_of(*, task: Task) -> McpSession | None:
    """The session a task was created in (None: ended and cleaned up, or enqueued without one)."""
    return McpSession.objects.filter(pk=task.session_id).first()


def task_by_request(*, session_id: str, request_id: Any) -> Task | None:
    """The plain request of a session with a JSON-RPC id (for notifications/cancelled)."""
    return (
        Task.objects.filter(session_id=session_id, kind=Task.Kind.REQUEST, request_id=request_id)
        .order_by("-seq")
        .first()
    )


# --- operators ------------------------------------------------------------------------------

#: Audit actions that record a refusal or a failed attempt (the dashboard and filters use them).
REFUSAL_ACTIONS = (
    "auth.failed", "auth.scope_refused", "ratelimit.refused", "quota.refused", "task.lookup_failed",
    "task.cross_tenant", "oauth.invalid_scope", "oauth.not_member", "login.throttled",
    # How many refusals the audit throttle counted instead of writing (mcptasks.audit.watch).
    "audit.suppressed",
)


def worker_is_alive(worker: WorkerHeartbeat, *, now: dt.datetime) -> bool:
    """A worker is alive while its last heartbeat is within one lease."""
    return worker.last_seen_at >= now - dt.timedelta(seconds=conf.get().WORKER_LEASE_S)


def alive_workers(*, now: dt.datetime) -> Any:
    """Workers whose heartbeat is within one lease."""
    return WorkerHeartbeat.objects.filter(last_seen_at__gte=now - dt.timedelta(seconds=conf.get().WORKER_LEASE_S))


# --- stream reads of the HTTP layer (added for mcptasks.endpoint, which holds no ORM) -------------


def stream_events_after(*, stream_id: str, after: int) -> list[StreamEvent]:
    """The stored events of ``stream_id`` past sequence number ``after``, in order (gap replay)."""
    return list(StreamEvent.objects.filter(stream_id=stream_id, seq__gt=after).order_by("seq"))


def stream_of_session(*, session_id: str, stream_id: str) -> bool:
    """Whether ``stream_id`` carried events of session ``session_id`` or answers one of its tasks.

    What a ``Last-Event-ID`` may resume besides a bound stream and the session's GET stream
    (the caller checks those first: no query).
    """
    return (
        StreamEvent.objects.filter(stream_id=stream_id, session_id=session_id).exists()
        or Task.objects.filter(stream_id=stream_id, session_id=session_id).exists()
    )


def session_task(*, session_id: str, task_id: str) -> Task | None:
    """The task ``task_id`` of session ``session_id`` (a resumed ``tasks/result`` stream's), or None."""
    return Task.objects.filter(task_id=task_id, session_id=session_id).first()


def reread_task(*, task: Task) -> Task | None:
    """``task``'s row as it is now (a blocking ``tasks/result`` re-checks it), or None once deleted."""
    return Task.objects.filter(pk=task.pk).first()
