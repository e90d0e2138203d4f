"""Tasks (and plain requests) and the server->client requests their tools make."""

from __future__ import annotations

import secrets
from typing import Any

from django.db import models

from mcptasks.models.status import LIVE, TERMINAL, TaskStatus
from mcptasks.models.taskqueries import TaskQuerySet


def new_task_id() -> str:
    """192 random bits from ``secrets``, URL-safe."""
    return secrets.token_urlsafe(24)


class Task(models.Model):
    """A durable execution of one request.

    ``kind=task`` rows are MCP Tasks (task-augmented calls). ``kind=request`` rows carry plain
    ``tools/call`` requests through the same worker pipeline; they are invisible to the
    ``tasks/*`` methods and are cleaned up shortly after they end.
    """

    class Kind(models.TextChoices):
        TASK = "task", "MCP task"
        REQUEST = "request", "plain request"

    seq = models.BigAutoField(primary_key=True)
    # Unique by a constraint, not ``unique=True``: that would add a second (LIKE) index every
    # insert and every non-HOT update pays for, and task ids are only ever compared whole.
    task_id = models.CharField(max_length=64, default=new_task_id, editable=False)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.TASK)
    # No index of its own: task_list_idx starts with it.
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="tasks", db_index=False)
    principal = models.ForeignKey("tenants.Principal", on_delete=models.CASCADE, related_name="tasks")
    session_id = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.WORKING)
    # null: no message (statusMessage is omitted on the wire), distinct from an empty one.
    status_message = models.TextField(null=True, blank=True)  # noqa: DJ001
    # The original request.
    method = models.CharField(max_length=64, default="tools/call")
    tool_name = models.CharField(max_length=128)
    params = models.JSONField(default=dict)
    request_id = models.JSONField(null=True)
    progress_token = models.JSONField(null=True)
    # Outcome: exactly one of result / error once terminal (neither when cancelled).
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    ttl_ms = models.BigIntegerField(null=True, blank=True)
    poll_interval_ms = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_index=True)
    last_updated_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # Execution bookkeeping.
    # The run's latest progress report ({"progress", "total", "message"}) for the operator's task
    # page, saved by the worker at most once a second (and its last report before the outcome),
    # whether or not the client asked for progress notifications.
    progress = models.JSONField(null=True, blank=True)
    # When a worker first claimed it (queued before, running after; shown on the task page).
    started_at = models.DateTimeField(null=True, blank=True)
    attempt = models.IntegerField(default=0)
    max_attempts = models.IntegerField(default=1)
    worker_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001 - null: unclaimed
    lease_expires_at = models.DateTimeField(null=True, blank=True)  # task_claim_idx covers it
    run_after = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Where server->client messages go: the POST stream of a plain request, or the
    # tasks/result stream that is open for a task right now (null: the session's GET stream).
    stream_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001 - null: the GET stream
    # A retried creation finds the task its first attempt made (mcptasks/tasks/idempotency.py): a hash
    # of the client's key or of (session, JSON-RPC id), unique per tenant and principal.
    idempotency_key = models.CharField(max_length=64, null=True, blank=True, editable=False)  # noqa: DJ001
    # The W3C traceparent of the span that created the task (empty while tracing is off), so the
    # worker's spans and a later tasks/result join the creating request's trace.
    traceparent = models.CharField(max_length=55, blank=True, default="")

    objects = TaskQuerySet.as_manager()

    class Meta:
        # Every index costs each insert and each claim and finish (status changes, so those
        # updates are never HOT): plain b-trees only where a query needs one (issue 27).
        indexes = [
            models.Index(fields=["status", "lease_expires_at"], name="task_claim_idx"),
            # The backlog (live, never leased) by tenant: a claim reads each busy tenant's oldest
            # rows from it, not every waiting row (see claimsql). A claimed row's new version
            # has a lease, so claims and finishes add nothing to it; a creation adds one entry.
            models.Index(fields=["tenant", "seq"], name="task_backlog_idx",
                         condition=models.Q(status__in=list(LIVE), lease_expires_at__isnull=True)),
            models.Index(fields=["tenant", "principal", "kind", "seq"], name="task_list_idx"),
            models.Index(fields=["session_id"], name="task_session_idx"),
            models.Index(fields=["tool_name"], name="task_tool_idx"),
        ]
        permissions = [("cancel_task", "Can cancel a task (as tasks/cancel does, audited)")]
        constraints = [
            models.UniqueConstraint(fields=["task_id"], name="task_task_id_uniq"),
            models.UniqueConstraint(
                fields=["tenant", "principal", "idempotency_key"], name="task_idempotency_uniq",
                condition=models.Q(idempotency_key__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.task_id[:8]}… {self.status}"

    @property
    def is_terminal(self) -> bool:
        """Whether the task has reached completed, failed or cancelled."""
        return self.status in TERMINAL

    def wire(self) -> dict[str, Any]:
        """The Task object of the 2025-11-25 protocol (the 2026-07-28 form: :mod:`mcptasks.tasks.wire`)."""
        data: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": wire_time(self.created_at),
            "lastUpdatedAt": wire_time(self.last_updated_at),
            "ttl": self.ttl_ms,
        }
        if self.status_message:
            data["statusMessage"] = self.status_message
        if self.poll_interval_ms is not None:
            data["pollInterval"] = self.poll_interval_ms
        return data


def wire_time(value: Any) -> str:
    """A timestamp as the protocol writes it: RFC 3339 with milliseconds and a Z suffix."""
    # isoformat is C; strftime parsed its format on every call (issue 27: 5 % of a tasks/get).
    return str(value.isoformat(timespec="milliseconds")[:23]) + "Z"


class TaskMessage(models.Model):
    """A server->client request made by a running tool (elicitation, sampling) and its answer."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="messages")
    # The JSON-RPC id the server used; globally unique so any process can route the answer.
    rpc_id = models.CharField(max_length=64, unique=True)
    method = models.CharField(max_length=64)
    params = models.JSONField(default=dict)
    response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["task", "answered_at"], name="taskmsg_pending_idx")]

    def __str__(self) -> str:
        return f"{self.method} {self.rpc_id}"
