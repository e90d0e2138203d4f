"""Writes: sessions, task creation, the task state machine, task messages, cleanup, audit.

Every function is keyword-only and given the caller's auth context (or a task it already
resolved through one). State changes are conditional UPDATEs, so concurrent writers on any
process can never store an illegal transition.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import secrets
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from tenants import quotas
from tenants.auth import AuthContext
from tenants.exceptions import QuotaExceeded
from tenants.models import Principal
from tenants.selectors import effective_limits

from . import audit, bus, conf, idempotency, limits, observability, webhooks
from .models import (
    TERMINAL,
    McpSession,
    Outcome,
    StreamCursor,
    StreamEvent,
    Task,
    TaskMessage,
    TaskStatus,
    WebhookDelivery,
    WorkerHeartbeat,
)
from .protocol.era2026 import VERSION as ERA2026_VERSION
from .protocol.errors import INTERNAL_ERROR, INVALID_PARAMS, McpError, cannot_cancel_message
from .protocol.messages import LOG_LEVELS, related_task_meta
from .registry import Tool

logger = logging.getLogger(__name__)

CANCELLED_MESSAGE = "The task was cancelled by request."
CANCELLED_ERROR = {"code": INTERNAL_ERROR, "message": "Task was cancelled"}


# --- sessions -------------------------------------------------------------------------------


def open_session(
    *, auth: AuthContext, protocol_version: str, client_info: dict[str, Any], capabilities: dict[str, Any]
) -> McpSession:
    """Create the session an ``initialize`` opens, bound to the caller's principal.

    Refused with -32602 when the client metadata is over ``CLIENT_METADATA_MAX_BYTES`` and with
    :class:`QuotaExceeded` (-32010) when the principal holds ``MAX_SESSIONS_PER_PRINCIPAL`` live
    sessions. The count runs under a lock on the principal's row, so concurrent ``initialize``
    requests (in any process) cannot overshoot it.
    """
    limits.check_client_metadata(client_info=client_info, capabilities=capabilities)
    cap = conf.get().MAX_SESSIONS_PER_PRINCIPAL
    with transaction.atomic():
        if cap > 0:
            Principal.objects.select_for_update().filter(pk=auth.principal_id).exists()
            held = live_sessions(principal_id=auth.principal_id, now=timezone.now()).count()
            if held >= cap:
                raise QuotaExceeded(
                    f"Too many sessions: this principal holds {held} live sessions (the limit is {cap}); "
                    "end one with HTTP DELETE or let idle ones expire",
                    {"limit": cap, "scope": "principal", "resource": "sessions"},
                )
        session = McpSession.objects.create(
            tenant_id=auth.tenant_id,
            principal_id=auth.principal_id,
            protocol_version=protocol_version,
            client_info=client_info,
            client_capabilities=capabilities,
        )
    record_audit(auth=auth, action="session.open", data={"protocolVersion": protocol_version})
    return session


def live_sessions(*, principal_id: int, now: dt.datetime) -> QuerySet[McpSession]:
    """The principal's sessions that count against ``MAX_SESSIONS_PER_PRINCIPAL``.

    Not ended, not idle past ``SESSION_IDLE_TIMEOUT_S``, not an uninitialized one past
    ``SESSION_INIT_TIMEOUT_S`` (cleanup deletes those), and not the row of a 2026-07-28 request
    (those stand for one request each and expire with it).
    """
    s = conf.get()
    return (
        McpSession.objects.filter(
            principal_id=principal_id,
            ended_at__isnull=True,
            last_seen_at__gt=now - dt.timedelta(seconds=s.SESSION_IDLE_TIMEOUT_S),
        )
        .exclude(protocol_version=ERA2026_VERSION)
        .exclude(initialized=False, created_at__lte=now - dt.timedelta(seconds=s.SESSION_INIT_TIMEOUT_S))
    )


def mark_initialized(*, session: McpSession) -> None:
    """``notifications/initialized`` arrived."""
    McpSession.objects.filter(pk=session.pk).update(initialized=True, last_seen_at=timezone.now())


def end_session(*, session: McpSession) -> None:
    """End a session (HTTP DELETE): later requests with its id get 404, its streams close."""
    McpSession.objects.filter(pk=session.pk, ended_at__isnull=True).update(ended_at=timezone.now())
    bus.signal_session(session.pk, "ended")


def set_log_level(*, session: McpSession, level: str) -> None:
    """``logging/setLevel``."""
    McpSession.objects.filter(pk=session.pk).update(log_level=level)


def set_subscription(*, session: McpSession, uri: str, subscribed: bool) -> None:
    """``resources/subscribe`` and ``resources/unsubscribe``."""
    subs = [u for u in session.subscriptions if u != uri]
    if subscribed:
        subs.append(uri)
    McpSession.objects.filter(pk=session.pk).update(subscriptions=subs)


# --- task creation --------------------------------------------------------------------------


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
    (:mod:`mcptasks.idempotency`) a retry returns the task the first attempt created.
    """
    if idempotency_key is not None:
        # No look-up first: a first attempt (nearly every creation) costs no extra round trip.
        # A retry's insert hits the unique key (at once, or once a concurrent duplicate commits)
        # and rolls back before any slot or audit row is taken; it then finds the first task.
        try:
            return _create_task(
                auth=auth, session=session, tool=tool, arguments=arguments, request_id=request_id,
                progress_token=progress_token, kind=kind, requested_ttl_ms=requested_ttl_ms, stream_id=stream_id,
                idempotency_key=idempotency_key,
            )
        except IntegrityError:
            # A duplicate committed first (if concurrent, the unique constraint made this insert
            # wait for it): answer with its task; this attempt left nothing behind.
            existing = _idempotent_match(auth=auth, key=idempotency_key, tool=tool, arguments=arguments)
            if existing is None:
                raise
            return existing
    return _create_task(
        auth=auth, session=session, tool=tool, arguments=arguments, request_id=request_id,
        progress_token=progress_token, kind=kind, requested_ttl_ms=requested_ttl_ms, stream_id=stream_id,
    )


def _idempotent_match(*, auth: AuthContext, key: str, tool: Tool, arguments: dict[str, Any]) -> Task | None:
    """The task this principal created with ``key``, or None; refuses a different call."""
    task = Task.objects.filter(tenant_id=auth.tenant_id, principal_id=auth.principal_id, idempotency_key=key).first()
    if task is not None and (task.tool_name != tool.name or (task.params or {}).get("arguments") != arguments):
        raise idempotency.mismatch()
    return task


def _create_task(
    *,
    auth: AuthContext,
    session: McpSession,
    tool: Tool,
    arguments: dict[str, Any],
    request_id: str | int,
    progress_token: str | int | None,
    kind: str,
    requested_ttl_ms: int | None,
    stream_id: str | None,
    idempotency_key: str | None = None,
) -> Task:
    limits = effective_limits(tenant_id=auth.tenant_id)
    now = timezone.now()
    if kind == Task.Kind.TASK:
        ttl = limits.default_ttl_ms if requested_ttl_ms is None else requested_ttl_ms
        # Clamped both ways: a client's ttl may be any JSON integer (2^63-1, 10^40).
        ttl = max(0, min(ttl, limits.max_ttl_ms))
        poll = limits.poll_interval_ms
    else:
        ttl = None
        poll = None
    expires = now + dt.timedelta(milliseconds=ttl) if ttl is not None else None
    max_attempts = conf.get().TASK_MAX_ATTEMPTS if tool.retryable else 1
    with transaction.atomic():
        task = Task.objects.create(
            kind=kind,
            tenant_id=auth.tenant_id,
            principal_id=auth.principal_id,
            session_id=session.pk,
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
            expires_at=expires,
            max_attempts=max_attempts,
            stream_id=stream_id,
            idempotency_key=idempotency_key,
            # The creating span, so the worker's spans join this request's trace ("" when off).
            traceparent=observability.current_traceparent(),
        )
        if kind == Task.Kind.TASK:
            record_audit(auth=auth, action="task.create", task_id=task.task_id, data={"tool": tool.name, "ttl": ttl})
        # Every run takes a slot, plain calls included: they occupy workers just the same. Taken
        # last, just before the commit: the slot's UPDATE locks the tenant's row until then, and
        # every creation of the tenant waits for that lock, so it is held for as little as can
        # be. A refusal rolls the task and its audit row back with it.
        quotas.acquire_task_slot(tenant_id=auth.tenant_id, principal_id=auth.principal_id)
        transaction.on_commit(bus.wake_workers)
    return task


# --- the state machine ----------------------------------------------------------------------


def transition(
    *,
    task: Task,
    to: str,
    status_message: str | None = None,
    result: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    attempt: int | None = None,
    clear_message: bool = False,
    extra: dict[str, Any] | None = None,
) -> bool:
    """Move ``task`` to ``to`` if the spec allows it from the stored status.

    One conditional UPDATE decides: ``WHERE status IN (legal sources)`` (and, for a worker,
    ``AND attempt = its attempt`` so a reclaimed run cannot finish the new one). Returns
    whether this call made the transition; the in-memory ``task`` is refreshed when it did.
    """
    now = timezone.now()
    updates: dict[str, Any] = {}
    if status_message is not None or clear_message:
        updates["status_message"] = status_message
    if result is not None:
        updates["result"] = result
    if error is not None:
        updates["error"] = error
    if extra:
        updates.update(extra)
    rows = Task.objects.filter(pk=task.pk)
    if attempt is not None:
        rows = rows.filter(attempt=attempt)
    terminal = to in TERMINAL
    with transaction.atomic():
        changed = rows.transition(to, now=now, **updates)
        if changed:
            updates.update(status=to, last_updated_at=now)
            if terminal:
                updates.update(finished_at=now, lease_expires_at=None)
                _ended(tasks=[task], messages={task.pk: status_message}, statuses={task.pk: to})
            for key, value in updates.items():
                setattr(task, key, value)
            # The outbox rows commit (or roll back) with the transition itself.
            webhooks.enqueue([task], now=now)
    if not changed:
        return False
    _after_change(task)
    return True


class Finished(list[bool]):
    """What :func:`finish_runs` returns: whether each outcome was written, plus ``deliveries``,
    the webhook rows the batch wrote (the worker wakes its sender only when there are some)."""

    deliveries: int = 0


def finish_runs(*, runs: list[tuple[Task, Outcome]]) -> Finished:
    """Write the outcomes of many worker runs in one transaction; whether each was written.

    What :func:`transition` does for one task, batched: the outcomes (a superseded or
    cancelled run writes nothing), the quota slots, the dead server->client requests and the
    audit events commit together; then waiters and requestors are told.
    """
    now = timezone.now()
    with transaction.atomic():
        won = set(Task.objects.finish([o for _t, o in runs], now=now))
        ended = [(t, o) for t, o in runs if o.pk in won]
        if ended:
            _ended(tasks=[t for t, _o in ended], messages={o.pk: o.message for _t, o in ended},
                   statuses={o.pk: o.status for _t, o in ended})
        for task, outcome in ended:
            task.status, task.last_updated_at, task.finished_at = outcome.status, now, now
            task.lease_expires_at = None
            if outcome.message is not None:
                task.status_message = outcome.message
            if outcome.result is not None:
                task.result = outcome.result
            if outcome.error is not None:
                task.error = outcome.error
        # The outbox rows of the whole batch commit (or roll back) with its outcomes.
        deliveries = webhooks.enqueue([t for t, _o in ended], now=now)
    _after_changes([t for t, _o in ended])
    finished = Finished(o.pk in won for _t, o in runs)
    finished.deliveries = deliveries
    return finished


def _ended(*, tasks: list[Task], messages: dict[int, str | None], statuses: dict[int, str]) -> None:
    """In the transaction that made ``tasks`` terminal: slots back, requests dropped, audited."""
    quotas.release_task_slots(slots=[(t.tenant_id, t.principal_id) for t in tasks])
    # Unanswered server->client requests die with their task.
    TaskMessage.objects.filter(task_id__in=[t.pk for t in tasks], answered_at__isnull=True).delete()
    # In the transition's own transaction: whoever sees the terminal status also finds its
    # audit event, and a crash cannot keep one without the other.
    audit.append_many(
        audit.event(tenant_id=t.tenant_id, principal_id=t.principal_id,
                    action=f"task.{statuses[t.pk]}", task_id=t.task_id,
                    data={"statusMessage": messages[t.pk]} if messages.get(t.pk) else {})
        for t in tasks if t.kind == Task.Kind.TASK
    )


def set_status_message(*, task: Task, message: str, attempt: int | None = None) -> bool:
    """Change the statusMessage of a live task (notifies like a status change).

    A worker passes its ``attempt`` so a superseded run cannot change the new run's message.
    """
    flt = Q(pk=task.pk, status__in=[TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED])
    if attempt is not None:
        flt &= Q(attempt=attempt)
    changed = Task.objects.filter(flt).update(status_message=message, last_updated_at=timezone.now())
    if changed:
        task.refresh_from_db()
        _after_change(task)
    return bool(changed)


def _after_change(task: Task) -> None:
    """Tell waiters (always) and the requestor (tasks only) that the task changed."""
    if task.kind == Task.Kind.TASK:
        message = _status_notification(task)
        if not _is_request_session(task.session_id):
            publish_for_task(task=task, message=message)
        else:
            # Only a 2025-11-25 tasks/result stream bound to the task could read it (a client
            # of that era may wait on a task created in this one): published there, as before.
            bound = Task.objects.filter(pk=task.pk).values_list("stream_id", flat=True).first()
            if bound:
                bus.publish(session_id=task.session_id, stream_id=bound, message=message)
    elif task.is_terminal and task.stream_id:
        _publish_request_outcome(task)
    bus.signal_task(task.task_id, "changed", status=task.status)


@functools.lru_cache(maxsize=4096)
def _is_request_session(session_id: str) -> bool:
    """Whether ``session_id`` is the session row of one 2026-07-28 request.

    No client ever holds such a session (the era has none): nobody can open or resume its GET
    stream, so a ``notifications/tasks/status`` stored there would be read by no one. Skipping it
    spares each status change a transaction and a channel-layer send before the task's signal,
    the wake-up of ``subscriptions/listen`` (the issue-29 latency budget). A session's protocol
    version never changes, so the answer is cached (sessions ids are server-made, bounded).
    """
    if not session_id:
        return False
    return McpSession.objects.filter(pk=session_id, protocol_version=ERA2026_VERSION).exists()


def _after_changes(tasks: list[Task]) -> None:
    """:func:`_after_change` for many tasks (a worker's batch of finishes), batched.

    The same notifications and signals, in the same order per stream, but one query finds the
    tasks' streams, one transaction stores every event (:func:`bus.publish_many`) and one hop to
    the event loop sends the pushes and the task signals.
    """
    if not tasks:
        return
    if len(tasks) == 1:
        _after_change(tasks[0])
        return
    notified = [t for t in tasks if t.kind == Task.Kind.TASK and t.session_id]
    open_streams = dict(
        Task.objects.filter(pk__in=[t.pk for t in notified]).exclude(stream_id="").exclude(stream_id__isnull=True)
        .values_list("pk", "stream_id")
    ) if notified else {}
    items: list[tuple[str, str, dict[str, Any]]] = []
    for task in tasks:
        if task.kind == Task.Kind.TASK:
            if task.session_id:
                bound = open_streams.get(task.pk)
                if bound is None and _is_request_session(task.session_id):
                    continue  # a 2026-07-28 request's session: nobody reads its stream (see below)
                stream = bound or bus.get_stream_id(task.session_id)
                items.append((task.session_id, stream, _status_notification(task)))
        elif task.is_terminal and task.stream_id:
            items.append((task.session_id, task.stream_id, _request_outcome_message(task)))
    bus.publish_many(items, signals=[bus.task_signal(t.task_id, "changed", status=t.status) for t in tasks])


def _status_notification(task: Task) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": task.wire()}


def _request_outcome_message(task: Task) -> dict[str, Any]:
    """What a plain request's POST stream gets when its task ended."""
    if task.status == TaskStatus.CANCELLED:
        # The spec: no response is sent for a cancelled request. End the stream instead.
        return {"_end": True}
    if task.error is not None:
        return {"jsonrpc": "2.0", "id": task.request_id, "error": task.error}
    return {"jsonrpc": "2.0", "id": task.request_id, "result": task.result or {"content": []}}


def _publish_request_outcome(task: Task) -> None:
    """A plain request ended: its response goes on the request's POST stream."""
    bus.publish(session_id=task.session_id, stream_id=task.stream_id or "", message=_request_outcome_message(task))


def stream_for_task(*, task: Task) -> str:
    """Where a task's messages go: its open tasks/result stream, else the session's GET stream."""
    current = Task.objects.filter(pk=task.pk).values_list("stream_id", flat=True).first()
    if current:
        return current
    return bus.get_stream_id(task.session_id)


def publish_for_task(*, task: Task, message: dict[str, Any]) -> str | None:
    """Send a notification about ``task`` on exactly one stream of the requestor's session.

    A task created without a client session (bulk-enqueued: ``session_id`` empty) has nobody
    to notify; its status and result are read with ``tasks/get`` and ``tasks/result``.
    """
    if not task.session_id:
        return None
    stream = task.stream_id if task.kind == Task.Kind.REQUEST and task.stream_id else stream_for_task(task=task)
    return bus.publish(session_id=task.session_id, stream_id=stream, message=message)


def task_result_payload(*, task: Task) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(result, error) that ``tasks/result`` returns for a terminal task.

    Exactly what the underlying request would have returned, plus the related-task ``_meta``
    on a result.
    """
    if task.error is not None:
        return None, dict(task.error)
    if task.status == TaskStatus.CANCELLED and task.result is None:
        return None, dict(CANCELLED_ERROR)
    result = dict(task.result or {"content": []})
    meta = dict(result.get("_meta") or {})
    meta.update(related_task_meta(task.task_id))
    result["_meta"] = meta
    return result, None


# --- cancellation ---------------------------------------------------------------------------


def cancel_task(*, auth: AuthContext, task_id: str) -> Task:
    """``tasks/cancel``: the task is ``cancelled`` before this returns, and its runner is told."""
    from .selectors import get_task

    task = get_task(auth=auth, task_id=task_id)
    if task.is_terminal:
        raise McpError(INVALID_PARAMS, cannot_cancel_message(task.status))
    ok = transition(
        task=task, to=TaskStatus.CANCELLED, status_message=CANCELLED_MESSAGE, extra={"cancel_requested": True}
    )
    if not ok:
        task.refresh_from_db()
        if task.is_terminal:
            raise McpError(INVALID_PARAMS, cannot_cancel_message(task.status))
        raise McpError(INTERNAL_ERROR, "Task changed concurrently; retry")
    bus.signal_task(task.task_id, "cancel")
    return task


def cancel_task_as_operator(*, operator: Any, task: Task) -> Task:
    """Cancel ``task`` from the admin: the same path as ``tasks/cancel``, plus who did it.

    The caller has checked that ``operator`` manages the task's tenant. The transition is
    audited like any cancellation; ``admin.cancel`` records the operator.
    """
    auth = AuthContext(
        tenant_id=task.tenant_id, tenant_slug=task.tenant.slug, principal_id=task.principal_id,
        principal_name=str(task.principal), scopes=frozenset({"mcp:tasks", "mcp:tasks:tenant"}),
        credential_ref=f"operator:{operator.pk}",
    )
    cancelled = cancel_task(auth=auth, task_id=task.task_id)
    record_audit_ids(
        tenant_id=task.tenant_id, principal_id=None, action="admin.cancel", task_id=task.task_id,
        data={"operator": operator.get_username()[:150], "operator_id": operator.pk, "model": "mcptasks.task",
              "object_id": task.task_id},
    )
    return cancelled


def cancel_request(*, session: McpSession, request_id: str | int) -> bool:
    """``notifications/cancelled`` for a plain in-flight ``tools/call`` of this session."""
    from .selectors import task_by_request

    task = task_by_request(session_id=session.pk, request_id=request_id)
    if task is None or task.is_terminal:
        return False
    ok = transition(task=task, to=TaskStatus.CANCELLED, status_message="Cancelled by the client",
                    extra={"cancel_requested": True})
    bus.signal_task(task.task_id, "cancel")
    return ok


# --- task messages (elicitation, sampling) --------------------------------------------------


def add_task_message(*, task: Task, method: str, params: dict[str, Any]) -> TaskMessage:
    """Queue a server->client request of a running tool and move the task to input_required."""
    rpc_id = "mcpt-" + secrets.token_urlsafe(12)
    params = dict(params)
    if task.kind == Task.Kind.TASK:
        meta = dict(params.get("_meta") or {})
        meta.update(related_task_meta(task.task_id))
        params["_meta"] = meta
    msg = TaskMessage.objects.create(task=task, rpc_id=rpc_id, method=method, params=params)
    if task.kind == Task.Kind.TASK:
        transition(task=task, to=TaskStatus.INPUT_REQUIRED)
    else:
        # A plain request's stream is its POST stream: deliver right away.
        deliver_task_message(task=task, message=msg, stream_id=task.stream_id or "")
    bus.signal_task(task.task_id, "message", rpc_id=rpc_id)
    return msg


def deliver_task_message(*, task: Task, message: TaskMessage, stream_id: str) -> None:
    """Send a queued request on a stream (the tasks/result stream or a plain call's POST)."""
    TaskMessage.objects.filter(pk=message.pk).update(delivered_at=timezone.now())
    bus.publish(
        session_id=task.session_id,
        stream_id=stream_id,
        message={"jsonrpc": "2.0", "id": message.rpc_id, "method": message.method, "params": message.params},
    )


def answer_task_message(*, auth: AuthContext, rpc_id: str, response: dict[str, Any]) -> bool:
    """Store the client's JSON-RPC response to a queued request and wake the tool.

    Returns False when no pending request of this principal has that id.
    """
    msg = (
        TaskMessage.objects.select_related("task")
        .filter(rpc_id=rpc_id, task__tenant_id=auth.tenant_id, task__principal_id=auth.principal_id)
        .first()
    )
    if msg is None:
        return False
    changed = TaskMessage.objects.filter(pk=msg.pk, answered_at__isnull=True).update(
        response=response, answered_at=timezone.now()
    )
    if not changed:
        return True  # a duplicate answer: the first one counts
    task = msg.task
    if task.kind == Task.Kind.TASK and not TaskMessage.objects.filter(task=task, answered_at__isnull=True).exists():
        transition(task=task, to=TaskStatus.WORKING)
    bus.signal_task(task.task_id, "answer", rpc_id=rpc_id)
    return True


def bind_result_stream(
    *, auth: AuthContext, task: Task, stream_id: str | None, only_if: str | None = None,
    only_if_unbound: bool = False,
) -> bool:
    """Attach (or detach, with None) the tasks/result stream that receives the task's messages.

    Only the task's own principal ever receives its input requests: a tenant-wide reader
    (``mcp:tasks:tenant``) may wait for the status and the result, but its stream is never
    bound, so it can neither see nor take over the owner's elicitations. ``only_if``: only
    while that stream is bound; ``only_if_unbound``: only while none is. Returns whether the
    binding changed.
    """
    qs = Task.objects.filter(pk=task.pk, tenant_id=auth.tenant_id, principal_id=auth.principal_id)
    if only_if is not None:
        qs = qs.filter(stream_id=only_if)
    if only_if_unbound:
        qs = qs.filter(stream_id__isnull=True)
    return bool(qs.update(stream_id=stream_id))


# --- cleanup --------------------------------------------------------------------------------


def cleanup_expired(
    *, batch_size: int | None = None, max_batches: int = 1000, now: dt.datetime | None = None
) -> dict[str, int]:
    """Delete expired tasks (with their messages), old plain requests and stream events.

    Bounded batches, each its own short transaction. On PostgreSQL the batch is picked with
    ``FOR UPDATE SKIP LOCKED``, so concurrent cleaners never delete the same rows twice.
    ``now``: the clock (tests pass their own).
    """
    settings = conf.get()
    batch = batch_size or settings.CLEANUP_BATCH_SIZE
    now = now or timezone.now()
    counts = {"tasks": 0, "requests": 0, "events": 0, "sessions": 0, "workers": 0, "anchors": 0, "webhooks": 0}
    for _ in range(max_batches):
        n = _delete_batch(Q(kind=Task.Kind.TASK, expires_at__lte=now), batch, release=True)
        counts["tasks"] += n
        if n < batch:
            break
    req_cutoff = now - dt.timedelta(seconds=settings.REQUEST_RETENTION_S)
    for _ in range(max_batches):
        # Only finished plain requests, or ones whose session is gone: a long tools/call that is
        # still running (its row untouched for a while) is never deleted under its client.
        live_sessions = McpSession.objects.filter(pk=OuterRef("session_id"))
        n = _delete_batch(
            Q(kind=Task.Kind.REQUEST, last_updated_at__lte=req_cutoff)
            & (Q(status__in=TERMINAL) | Q(~Exists(live_sessions))),
            batch, release=True,
        )
        counts["requests"] += n
        if n < batch:
            break
    ev_cutoff = now - dt.timedelta(seconds=settings.SSE_RETENTION_S)
    for _ in range(max_batches):
        ids = list(StreamEvent.objects.filter(created_at__lte=ev_cutoff).values_list("id", flat=True)[:batch])
        if ids:
            StreamEvent.objects.filter(id__in=ids).delete()
        counts["events"] += len(ids)
        if len(ids) < batch:
            break
    idle_cutoff = now - dt.timedelta(seconds=settings.SESSION_IDLE_TIMEOUT_S)
    # Sessions that never initialized, and the rows of 2026-07-28 requests (one per tools/call),
    # go within minutes, not after a day idle: nobody resumes them, and every request makes one.
    # A request row stays while its plain run is live (its rounds and events are stored under it).
    init_cutoff = now - dt.timedelta(seconds=settings.SESSION_INIT_TIMEOUT_S)
    req_row_cutoff = now - dt.timedelta(seconds=settings.REQUEST_RETENTION_S)
    live_runs = Task.objects.filter(kind=Task.Kind.REQUEST, session_id=OuterRef("pk")).exclude(status__in=TERMINAL)
    stale = list(
        McpSession.objects.filter(
            Q(ended_at__lte=idle_cutoff)
            | Q(last_seen_at__lte=idle_cutoff)
            | Q(initialized=False, created_at__lte=init_cutoff)
            | (Q(protocol_version=ERA2026_VERSION, last_seen_at__lte=req_row_cutoff) & ~Exists(live_runs))
        )
        .exclude(pk__in=Task.objects.filter(kind=Task.Kind.TASK).values("session_id"))
        .values_list("pk", flat=True)[:batch]
    )
    if stale:
        counts["sessions"] = McpSession.objects.filter(pk__in=stale).delete()[1].get("mcptasks.McpSession", 0)
    # Stream cursors live as long as their session, so sequence numbers never restart on a
    # stream a client might still resume.
    orphans = list(
        StreamCursor.objects.exclude(session_id__in=McpSession.objects.values("pk")).values_list("pk", flat=True)[
            :batch
        ]
    )
    if orphans:
        StreamCursor.objects.filter(pk__in=orphans).delete()
    # Heartbeat rows of workers that died without a clean exit (their tasks are reclaimed by
    # lease expiry; the row only tells operators). Kept for ten leases so they can be seen.
    dead_cutoff = now - dt.timedelta(seconds=max(60.0, 10 * settings.WORKER_LEASE_S))
    counts["workers"] = WorkerHeartbeat.objects.filter(last_seen_at__lt=dead_cutoff).delete()[0]
    hook_cutoff = now - dt.timedelta(seconds=settings.WEBHOOK_RETENTION_S)
    for _ in range(max_batches):
        # Pending rows stay whatever their age: they are the outbox.
        ids = list(WebhookDelivery.objects.filter(created_at__lte=hook_cutoff).exclude(
            state=WebhookDelivery.State.PENDING).values_list("id", flat=True)[:batch])
        if ids:
            WebhookDelivery.objects.filter(id__in=ids).delete()
        counts["webhooks"] += len(ids)
        if len(ids) < batch:
            break
    counts["anchors"] = audit.thin_anchors(older_than=dt.timedelta(seconds=settings.AUDIT_ANCHOR_RETENTION_S))
    if any(counts.values()):
        logger.info("cleanup removed %s", counts)
    return counts


#: Session activity is recorded at most this often (idle cleanup works in hours).
TOUCH_INTERVAL_S = 60.0


def session_needs_touch(*, session: McpSession) -> bool:
    """Whether :func:`touch_session` would write (no I/O: callers skip the hop otherwise)."""
    last = session.last_seen_at
    return last is None or (timezone.now() - last).total_seconds() >= TOUCH_INTERVAL_S


def touch_session(*, session: McpSession) -> None:
    """Record activity on a session (at most once a minute) so idle cleanup spares it."""
    if session_needs_touch(session=session):
        now = timezone.now()
        McpSession.objects.filter(pk=session.pk).update(last_seen_at=now)
        session.last_seen_at = now


def _delete_batch(flt: Q, batch: int, *, release: bool) -> int:
    with transaction.atomic():
        qs = Task.objects.filter(flt).order_by("seq")
        if connection.vendor == "postgresql":
            qs = qs.select_for_update(skip_locked=True)
        rows = list(qs.values_list("seq", "status", "tenant_id", "principal_id", "task_id", "kind")[:batch])
        if not rows:
            return 0
        seqs = [r[0] for r in rows]
        TaskMessage.objects.filter(task_id__in=seqs).delete()
        deleted = Task.objects.filter(seq__in=seqs).delete()[1].get("mcptasks.Task", 0)
        # Tasks (not plain requests) leave the trail in the same transaction as they leave the store.
        audit.append_many(
            audit.event(tenant_id=tenant_id, principal_id=principal_id, action="task.expired", task_id=task_id,
                        data={"status": status})
            for _seq, status, tenant_id, principal_id, task_id, kind in rows if kind == Task.Kind.TASK
        )
        if release:
            for _seq, status, tenant_id, principal_id, _tid, _kind in rows:
                if status not in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED):
                    quotas.release_task_slot(tenant_id=tenant_id, principal_id=principal_id)
    for _seq, status, _t, _p, task_id, _kind in rows:
        if status not in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED):
            bus.signal_task(task_id, "cancel")
    return int(deleted)


# --- workers --------------------------------------------------------------------------------


def worker_gone(*, worker_id: str) -> None:
    """A worker exited cleanly: its heartbeat row goes."""
    WorkerHeartbeat.objects.filter(worker_id=worker_id).delete()


def worker_heartbeat(*, worker_id: str, hostname: str, pid: int, concurrency: int, running: int,
                     stopping: bool = False, rss_bytes: int = 0, asyncio_tasks: int = 0) -> None:
    """Register or refresh a worker's liveness row (with its memory figures for ``/metrics``)."""
    WorkerHeartbeat.objects.update_or_create(
        worker_id=worker_id,
        defaults={
            "hostname": hostname,
            "pid": pid,
            "concurrency": concurrency,
            "running": running,
            "last_seen_at": timezone.now(),
            "stopping": stopping,
            "rss_bytes": rss_bytes,
            "asyncio_tasks": asyncio_tasks,
        },
    )


# --- audit ----------------------------------------------------------------------------------


async def arecord_task_retrieval(*, auth: AuthContext, task: Task) -> None:
    """Audit that the caller fetched a task's outcome (``tasks/result``); no thread hop on PostgreSQL."""
    await audit.aappend(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action="task.result",
                        task_id=task.task_id, data={"status": task.status})


def record_audit(*, auth: AuthContext, action: str, task_id: str = "", data: dict[str, Any] | None = None) -> None:
    """Append an audit event for the caller."""
    record_audit_ids(
        tenant_id=auth.tenant_id, principal_id=auth.principal_id, action=action, task_id=task_id, data=data
    )


def record_audit_ids(
    *, tenant_id: int | None, principal_id: int | None, action: str, task_id: str = "",
    data: dict[str, Any] | None = None,
) -> None:
    """Append an audit event (one INSERT; :func:`mcptasks.audit.seal` chains it shortly after)."""
    audit.append(tenant_id=tenant_id, principal_id=principal_id, action=action, task_id=task_id, data=data)


def log_level_allows(session_level: str, level: str) -> bool:
    """Whether a message at ``level`` passes the session's ``logging/setLevel`` threshold."""
    try:
        return LOG_LEVELS.index(level) >= LOG_LEVELS.index(session_level)
    except ValueError:
        return True

