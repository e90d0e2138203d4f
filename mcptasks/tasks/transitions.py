"""The task state machine: every status change, single or batched, and cancellation.

Each change is a named, conditional transition of :class:`~mcptasks.models.TaskQuerySet`
(``UPDATE ... WHERE status IN (legal sources)``, and ``attempt = <the run's>`` for a worker), so
concurrent writers on any process can never store an illegal one. In the same transaction a
terminal change gives the quota slot back, drops the unanswered input requests, appends the
audit event and writes the webhook outbox rows; after the commit :mod:`~mcptasks.tasks.fanout`
tells the waiters and the requestor.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
from contextlib import nullcontext
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from mcptasks import conf
from mcptasks.audit import trail as audit
from mcptasks.db import prepared
from mcptasks.models import TERMINAL, McpSession, Outcome, Task, TaskStatus
from mcptasks.protocol.errors import INTERNAL_ERROR, INVALID_PARAMS, McpError, cannot_cancel_message
from mcptasks.streams import signals
from mcptasks.tasks import auditing, fanout, finishsql, selectors, webhook_outbox
from tenants import quotas
from tenants.auth import AuthContext

logger = logging.getLogger(__name__)


CANCELLED_MESSAGE = "The task was cancelled by request."


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
            webhook_outbox.enqueue([task], now=now)
            if terminal:
                _give_back_slots([task])
    if not changed:
        return False
    fanout.after_change(task)
    return True


class Finished(list[bool]):
    """What :func:`finish_runs` returns: whether each outcome was written, plus ``deliveries``,
    the webhook rows the batch wrote (the worker wakes its sender only when there are some)."""

    deliveries: int = 0


def finish_runs(*, runs: list[tuple[Task, Outcome]]) -> Finished:
    """Write the outcomes of many worker runs at once; whether each was written.

    What :func:`transition` does for one task, batched: the outcomes (a superseded or
    cancelled run writes nothing), the quota slots, the dead server->client requests and the
    audit events commit together; then waiters and requestors are told. On PostgreSQL that is
    one statement (:mod:`~mcptasks.tasks.finishsql`), which also stores the stream events,
    unless a tenant of the batch has webhook endpoints, whose outbox rows the ORM transaction
    renders.
    """
    now = timezone.now()
    won = _finish_statement(runs, now=now) if connection.vendor == "postgresql" and runs else None
    deliveries = 0
    if won is None:
        won, deliveries = _finish_transaction(runs, now=now)
        fanout.after_changes([t for t, o in runs if o.pk in won])
    finished = Finished(o.pk in won for _t, o in runs)
    finished.deliveries = deliveries
    return finished


def _finish_statement(runs: list[tuple[Task, Outcome]], *, now: dt.datetime) -> set[int] | None:
    """:func:`finish_runs` as one statement, the fan-out's events included; None if a tenant of
    the batch has webhook endpoints (nothing was written).

    In autocommit on a direct connection (no lock outlives the statement); behind a transaction
    pooler inside a transaction, where the timeouts are set per transaction.
    """
    changed = [copy.copy(task) for task, _o in runs]
    for task, (_t, outcome) in zip(changed, runs, strict=True):
        _apply(task, outcome, now=now)  # the notes show each task as its outcome leaves it
    notes = fanout.notes_for(changed)
    outcomes = [o for _t, o in runs]
    with nullcontext() if prepared.runs_alone() else transaction.atomic():
        written = finishsql.finish(outcomes, now=now, notes=notes)
    if written is None:
        return None
    won = set(written.won)
    ended = []
    for task, outcome in runs:
        if outcome.pk in won:
            _apply(task, outcome, now=now)
            ended.append(task)
    # After the commit (at once in autocommit), as after_changes sends them.
    transaction.on_commit(lambda: fanout.after_stored(tasks=ended, stored=written.stored, unstored=written.unstored))
    return won


def _finish_transaction(runs: list[tuple[Task, Outcome]], *, now: dt.datetime) -> tuple[set[int], int]:
    """:func:`finish_runs`'s writes as an ORM transaction: the won pks and the webhook rows written."""
    with transaction.atomic():
        won = set(Task.objects.finish([o for _t, o in runs], now=now))
        ended = [(t, o) for t, o in runs if o.pk in won]
        if ended:
            _ended(tasks=[t for t, _o in ended], messages={o.pk: o.message for _t, o in ended},
                   statuses={o.pk: o.status for _t, o in ended})
        for task, outcome in ended:
            _apply(task, outcome, now=now)
        # The outbox rows of the whole batch commit (or roll back) with its outcomes.
        deliveries = webhook_outbox.enqueue([t for t, _o in ended], now=now)
        _give_back_slots([t for t, _o in ended])
    return won, deliveries


def _apply(task: Task, outcome: Outcome, *, now: dt.datetime) -> None:
    """The in-memory ``task`` as its written ``outcome`` left the row."""
    task.status, task.last_updated_at, task.finished_at = outcome.status, now, now
    task.lease_expires_at = None
    if outcome.message is not None:
        task.status_message = outcome.message
    if outcome.result is not None:
        task.result = outcome.result
    if outcome.error is not None:
        task.error = outcome.error


def _ended(*, tasks: list[Task], messages: dict[int, str | None], statuses: dict[int, str]) -> None:
    """In the transaction that made ``tasks`` terminal: requests dropped, audited (the slots go
    back last, :func:`_give_back_slots`)."""
    # Unanswered server->client requests die with their task.
    selectors.pending_input(task_ids=[t.pk for t in tasks]).delete()
    # In the transition's own transaction: whoever sees the terminal status also finds its
    # audit event, and a crash cannot keep one without the other.
    audit.append_many(
        audit.event(tenant_id=t.tenant_id, principal_id=t.principal_id,
                    action=f"task.{statuses[t.pk]}", task_id=t.task_id,
                    data={"statusMessage": messages[t.pk]} if messages.get(t.pk) else {})
        for t in tasks if t.kind == Task.Kind.TASK
    )


def _give_back_slots(tasks: list[Task]) -> None:
    """The quota slots of ``tasks``, given back as the last statement before the commit.

    The release locks the tenant's (and principal's) counter row until the commit, and every
    creation of that tenant waits for the lock: taken last, it is held for one round trip (the
    COMMIT), never across the audit, input and outbox statements (issue 27).
    """
    if tasks:
        quotas.release_task_slots(slots=[(t.tenant_id, t.principal_id) for t in tasks])


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
        fanout.after_change(task)
    return bool(changed)


def cancel_task(*, auth: AuthContext, task_id: str) -> Task:
    """``tasks/cancel``: the task is ``cancelled`` before this returns, and its runner is told."""
    task = selectors.get_task(auth=auth, task_id=task_id)
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
    signals.signal_task(task.task_id, "cancel", worker_id=task.worker_id)
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
    auditing.record_audit_ids(
        tenant_id=task.tenant_id, principal_id=None, action="admin.cancel", task_id=task.task_id,
        data={"operator": operator.get_username()[:150], "operator_id": operator.pk, "model": "mcptasks.task",
              "object_id": task.task_id},
    )
    return cancelled


def cancel_request(*, session: McpSession, request_id: str | int) -> bool:
    """``notifications/cancelled`` for a plain in-flight ``tools/call`` of this session."""
    task = selectors.task_by_request(session_id=session.pk, request_id=request_id)
    if task is None or task.is_terminal:
        return False
    ok = transition(task=task, to=TaskStatus.CANCELLED, status_message="Cancelled by the client",
                    extra={"cancel_requested": True})
    signals.signal_task(task.task_id, "cancel", worker_id=task.worker_id)
    return ok


#: The statusMessage of a non-retryable task whose worker died (documented; tests rely on it).
WORKER_LOST = "worker lost during execution"


def fail_lost_runs(*, reaper_id: str) -> int:
    """Fail tasks whose last allowed attempt lost its worker (lease expired); how many.

    The row is first taken over with a conditional UPDATE (lease still expired, same
    attempt, :meth:`TaskQuerySet.take_over_lost`), so a worker that was only slow and renews
    concurrently is told to stop instead of racing the reaper; then the failure is written
    ``WHERE attempt = <that attempt>``.
    """
    now = timezone.now()
    lease = now + dt.timedelta(seconds=conf.get().WORKER_LEASE_S)
    failed = 0
    for task in Task.objects.take_over_lost(reaper_id=reaper_id, now=now, lease_until=lease):
        ok = transition(
            task=task, to=TaskStatus.FAILED, status_message=WORKER_LOST,
            error={"code": INTERNAL_ERROR, "message": WORKER_LOST}, attempt=task.attempt,
        )
        if ok:
            failed += 1
            logger.warning("task %s failed: %s (attempt %d)", task.task_id, WORKER_LOST, task.attempt)
    return failed
