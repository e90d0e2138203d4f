"""Cleanup: expired tasks, old plain requests, stream events, stale sessions and cursors, dead
workers' rows, old webhook deliveries and audit anchors; bounded batches, safe to run anywhere."""

from __future__ import annotations

import datetime as dt
import logging

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from mcptasks import conf
from mcptasks.audit import trail as audit
from mcptasks.models import (
    TERMINAL,
    McpSession,
    StreamCursor,
    StreamEvent,
    Task,
    TaskMessage,
    TaskStatus,
    WebhookDelivery,
    WorkerHeartbeat,
)
from mcptasks.protocol.era2026 import VERSION as ERA2026_VERSION
from mcptasks.streams import signals
from tenants import quotas

logger = logging.getLogger(__name__)


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


def _delete_batch(flt: Q, batch: int, *, release: bool) -> int:
    with transaction.atomic():
        qs = Task.objects.filter(flt).order_by("seq")
        if connection.vendor == "postgresql":
            qs = qs.select_for_update(skip_locked=True)
        rows = list(qs.values_list("seq", "status", "tenant_id", "principal_id", "task_id", "kind",
                                   "worker_id")[:batch])
        if not rows:
            return 0
        seqs = [r[0] for r in rows]
        TaskMessage.objects.filter(task_id__in=seqs).delete()
        deleted = Task.objects.filter(seq__in=seqs).delete()[1].get("mcptasks.Task", 0)
        # Tasks (not plain requests) leave the trail in the same transaction as they leave the store.
        audit.append_many(
            audit.event(tenant_id=tenant_id, principal_id=principal_id, action="task.expired", task_id=task_id,
                        data={"status": status})
            for _seq, status, tenant_id, principal_id, task_id, kind, _w in rows if kind == Task.Kind.TASK
        )
        if release:
            for _seq, status, tenant_id, principal_id, _tid, _kind, _w in rows:
                if status not in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED):
                    quotas.release_task_slot(tenant_id=tenant_id, principal_id=principal_id)
    for _seq, status, _t, _p, task_id, _kind, worker_id in rows:
        if status not in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED):
            signals.signal_task(task_id, "cancel", worker_id=worker_id)
    return int(deleted)
