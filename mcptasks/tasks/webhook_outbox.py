"""The webhook outbox: the deliveries a task's new status owes, written in the transition's transaction.

:func:`enqueue` runs inside the transaction that changes a task's status
(:func:`mcptasks.tasks.transitions.transition` and ``finish_runs``): one
:class:`~mcptasks.models.WebhookDelivery` row per matching endpoint, so a committed transition
always has its deliveries and a rolled-back one has none. A tenant without endpoints costs one
indexed query. Workers deliver the rows (:mod:`mcptasks.streams.webhooks`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from mcptasks.models import Task, WebhookDelivery, wire_time
from mcptasks.tasks.era2026_view import task_as_seen_by
from mcptasks.tasks.wire import wire_status
from tenants.models import WebhookEndpoint


def enqueue(tasks: list[Task], *, now: dt.datetime | None = None) -> int:
    """Write the deliveries of ``tasks``' new statuses; call inside the transition's transaction.

    ``tasks`` carry their new status in memory. Plain requests (``kind=request``) have no events.
    Returns the rows written.
    """
    tasks = [t for t in tasks if t.kind == Task.Kind.TASK]
    if not tasks:
        return 0
    endpoints = list(
        WebhookEndpoint.objects.filter(tenant_id__in={t.tenant_id for t in tasks}, enabled=True)
        .values("pk", "tenant_id", "tenant__slug", "principal_id", "events")
    )
    if not endpoints:
        return 0
    now = now or timezone.now()
    rows = []
    for task in tasks:
        event = f"task.{wire_status(task)}"
        # At most two bodies per event: the owner's view and a tenant-wide reader's (no inputRequests).
        bodies: dict[int | None, dict[str, Any]] = {}
        for ep in endpoints:
            if ep["tenant_id"] != task.tenant_id or event not in (ep["events"] or []):
                continue
            if ep["principal_id"] is not None and ep["principal_id"] != task.principal_id:
                continue
            viewer = ep["principal_id"]
            if viewer not in bodies:
                # Rendered now: the body shows the task as of this event, not as of delivery.
                bodies[viewer] = {"type": event, "timestamp": wire_time(now), "tenant": ep["tenant__slug"],
                                  "data": task_as_seen_by(task, principal_id=viewer)}
            rows.append(WebhookDelivery(endpoint_id=ep["pk"], tenant_id=task.tenant_id, task_id=task.task_id,
                                        event=event, payload=bodies[viewer], created_at=now, next_attempt_at=now))
    if rows:
        WebhookDelivery.objects.bulk_create(rows)
    return len(rows)
