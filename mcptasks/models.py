"""State of the MCP server: sessions, tasks, queued task messages, stream events, workers, audit.

Models hold state and small transition helpers; the rules live in services.py and selectors.py.
"""

from __future__ import annotations

import datetime as dt
import secrets
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connection, models, transaction
from django.db.models import Case, F, OuterRef, Q, Subquery, Value, When, Window
from django.db.models.functions import Coalesce, RowNumber
from django.utils import timezone

from .protocol.messages import TERMINAL_STATUSES, sources_for
from .protocol.messages import TaskStatus as WireStatus


def tool_lock_key(tool_name: str) -> int:
    """A stable signed 32-bit key for ``pg_advisory_xact_lock`` of one tool's concurrency limit."""
    return zlib.crc32(f"mcptasks.tool:{tool_name}".encode()) - 2**31


def new_session_id() -> str:
    """256 random bits, URL-safe: visible ASCII only, as the transport requires."""
    return secrets.token_urlsafe(32)


def new_task_id() -> str:
    """192 random bits from ``secrets``, URL-safe."""
    return secrets.token_urlsafe(24)


class McpSession(models.Model):
    """One MCP session (``Mcp-Session-Id``); stored so any daphne process can serve it."""

    id = models.CharField(primary_key=True, max_length=64, default=new_session_id, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="mcp_sessions")
    principal = models.ForeignKey("tenants.Principal", on_delete=models.CASCADE, related_name="mcp_sessions")
    protocol_version = models.CharField(max_length=16)
    client_info = models.JSONField(default=dict)
    client_capabilities = models.JSONField(default=dict)
    log_level = models.CharField(max_length=16, default="info")
    subscriptions = models.JSONField(default=list)
    initialized = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(auto_now_add=True, db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "MCP session"

    def __str__(self) -> str:
        return f"session {self.id[:8]}…"


class TaskStatus(models.TextChoices):
    """Task states (the spec's five)."""

    WORKING = WireStatus.WORKING.value, "working"
    INPUT_REQUIRED = WireStatus.INPUT_REQUIRED.value, "input required"
    COMPLETED = WireStatus.COMPLETED.value, "completed"
    FAILED = WireStatus.FAILED.value, "failed"
    CANCELLED = WireStatus.CANCELLED.value, "cancelled"


#: The terminal statuses (defined once, in the protocol layer) and the live ones.
TERMINAL = frozenset(s.value for s in TERMINAL_STATUSES)
LIVE = (TaskStatus.WORKING.value, TaskStatus.INPUT_REQUIRED.value)


@dataclass
class Outcome:
    """How one run of a task ended: what :meth:`TaskQuerySet.finish` writes."""

    pk: int
    attempt: int
    status: str
    message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskQuerySet(models.QuerySet["Task"]):
    """The task data layer: every state change is a named, conditional transition here.

    Each transition is ``UPDATE … WHERE status IN (legal sources)`` (and ``attempt = <the
    run's>`` for a worker), so concurrent writers in any process can never store an illegal
    change or let a superseded run overwrite the current one.
    """

    def live(self) -> TaskQuerySet:
        """Tasks still working or waiting for input."""
        return self.filter(status__in=LIVE)

    def transition(self, to: str, **fields: Any) -> int:
        """Move the selected rows to ``to`` where the spec allows it; returns rows changed."""
        now = fields.pop("now", None) or timezone.now()
        updates: dict[str, Any] = {"status": to, "last_updated_at": now, **fields}
        if to in TERMINAL:
            updates.update(finished_at=now, lease_expires_at=None)
        return self.filter(status__in=sources_for(to)).update(**updates)

    def complete(self, *, result: dict[str, Any], **fields: Any) -> int:
        """Record a successful run."""
        return self.transition(TaskStatus.COMPLETED, result=result, **fields)

    def fail(self, *, message: str, result: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
             **fields: Any) -> int:
        """Record a failed run (a tool error result, or a JSON-RPC error)."""
        return self.transition(TaskStatus.FAILED, status_message=message, result=result, error=error, **fields)

    def cancel(self, *, message: str, **fields: Any) -> int:
        """Cancel the selected live tasks."""
        return self.transition(TaskStatus.CANCELLED, status_message=message, cancel_requested=True, **fields)

    def claimable(self, *, now: dt.datetime) -> TaskQuerySet:
        """Live tasks a worker may start now: not cancelled, unleased (or lapsed), attempts left."""
        return (
            self.live().filter(cancel_requested=False)
            .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
            .filter(attempt__lt=F("max_attempts"))
            .filter(Q(run_after__isnull=True) | Q(run_after__lte=now))
        )

    def claim(self, *, worker_id: str, limit: int, now: dt.datetime, lease_until: dt.datetime,
              exclude: Iterable[str] = (), limited: dict[str, int] | None = None,
              tenant_running: dict[int, int] | None = None, tenant_cap: int | None = None) -> list[Task]:
        """Take up to ``limit`` claimable tasks for ``worker_id`` in one short transaction.

        Fair across tenants: the oldest claimable task of every tenant comes first, then each
        tenant's second, and so on, a tenant with runs in this worker (``tenant_running``:
        tenant id -> runs) that many turns later (ranked without locks; the rows are then
        locked with ``SKIP LOCKED`` and re-checked in that order). With ``tenant_cap`` a tenant
        ends up with at most that many runs in this worker: tenants at the cap are not even
        ranked, so their backlog never hides another tenant's work. The counts are the
        worker's own, so the cap needs no coordination between workers. ``limited`` maps tools with ``max_concurrency``
        to their limit: their free slots are counted under a per-tool advisory lock on
        PostgreSQL. The claimed rows carry the next attempt number, the worker and the lease,
        plus ``client_caps``, ``tenant_slug`` and ``principal_ident`` for the tool's context.
        """
        on_pg = connection.vendor == "postgresql"
        with transaction.atomic():
            runnable = self.claimable(now=now)
            skip = list(exclude)
            if skip:
                # A lease of ours that lapsed (a long stall) must not start a second local run.
                runnable = runnable.exclude(task_id__in=skip)
            capacity = runnable._capacity(limited or {}, now=now, on_pg=on_pg)
            full = [name for name, free in capacity.items() if free <= 0]
            base = runnable.exclude(tool_name__in=full) if full else runnable
            held = dict(tenant_running or {})
            if tenant_cap is not None:
                capped = [tenant for tenant, n in held.items() if n >= tenant_cap]
                if capped:
                    base = base.exclude(tenant_id__in=capped)
            ranked = list(
                base.annotate(turn=Window(RowNumber(), partition_by=[F("tenant_id")], order_by=F("seq").asc()))
                .order_by("turn", "seq")
                .values_list("pk", "tenant_id", "turn")[: limit * 4]
            )
            # Tenants with the fewest runs here first: a tenant already running n tools waits n turns.
            ranked.sort(key=lambda row: (row[2] + held.get(row[1], 0), row[0]))
            fair = [pk for pk, _tenant, _turn in ranked]
            position = {pk: i for i, pk in enumerate(fair)}
            caps = McpSession.objects.filter(pk=OuterRef("session_id")).values("client_capabilities")[:1]
            qs = base.filter(pk__in=fair).order_by("seq").annotate(
                client_caps=Subquery(caps), tenant_slug=F("tenant__slug"), principal_ident=F("principal__identifier")
            )
            if on_pg:
                qs = qs.select_for_update(skip_locked=True, of=("self",))
            claimed: list[Task] = []
            for task in sorted(qs, key=lambda t: position[t.pk]):
                if len(claimed) >= limit:
                    break
                if tenant_cap is not None and held.get(task.tenant_id, 0) >= tenant_cap:
                    continue
                if task.tool_name in capacity:
                    if capacity[task.tool_name] <= 0:
                        continue
                    capacity[task.tool_name] -= 1
                held[task.tenant_id] = held.get(task.tenant_id, 0) + 1
                claimed.append(task)
            if claimed:
                # The rows are locked (PostgreSQL) or the database is (SQLite's IMMEDIATE
                # transaction), so one UPDATE stamps the whole batch.
                self.model.objects.filter(pk__in=[t.pk for t in claimed]).update(
                    attempt=F("attempt") + 1, worker_id=worker_id, lease_expires_at=lease_until,
                    started_at=Coalesce(F("started_at"), Value(now)),
                )
                for stamped in claimed:
                    stamped.attempt += 1
                    stamped.worker_id = worker_id
                    stamped.lease_expires_at = lease_until
        return claimed

    def _capacity(self, limited: dict[str, int], *, now: dt.datetime, on_pg: bool) -> dict[str, int]:
        """Free slots of every tool in ``limited`` that has tasks here.

        On PostgreSQL each such tool's advisory transaction lock is taken (in a fixed order, so
        two claimers never deadlock) before counting its leased rows: the count and the claims
        are then atomic with respect to every other worker. SQLite serialises writers anyway.
        """
        if not limited:
            return {}
        waiting = sorted(set(self.filter(tool_name__in=list(limited)).values_list("tool_name", flat=True)))
        capacity: dict[str, int] = {}
        for name in waiting:
            if on_pg:
                with connection.cursor() as cur:
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", [tool_lock_key(name)])
            running = self.model.objects.live().filter(tool_name=name, lease_expires_at__gt=now).count()
            capacity[name] = int(limited[name] or 0) - running
        return capacity

    def renew(self, *, worker_id: str, runs: dict[str, int], lease_until: dt.datetime) -> list[str]:
        """Extend the leases of ``worker_id``'s runs (task id -> attempt) in one UPDATE.

        Returns the task ids whose run must stop: cancelled, finished, or taken over by another
        attempt.
        """
        ids = list(runs)
        self.live().filter(task_id__in=ids, worker_id=worker_id, cancel_requested=False).update(
            lease_expires_at=lease_until
        )
        rows = self.filter(task_id__in=ids).values_list("task_id", "attempt", "worker_id", "status", "cancel_requested")
        alive = {
            tid for tid, attempt, wid, status, cancel in rows
            if wid == worker_id and attempt == runs[tid] and status in LIVE and not cancel
        }
        return [tid for tid in ids if tid not in alive]

    def is_current_run(self, *, task_id: str, attempt: int) -> bool:
        """Whether ``attempt`` is still the live, uncancelled run of the task."""
        return self.live().filter(task_id=task_id, attempt=attempt, cancel_requested=False).exists()

    def hand_back(self, *, worker_id: str, runs: list[tuple[str, int]]) -> int:
        """Release ``worker_id``'s leases at once; the interrupted attempts do not count."""
        n = 0
        for task_id, attempt in runs:
            n += self.live().filter(task_id=task_id, attempt=attempt, worker_id=worker_id).update(
                lease_expires_at=None, worker_id=None, max_attempts=F("max_attempts") + 1
            )
        return n

    def take_over_lost(self, *, reaper_id: str, now: dt.datetime, lease_until: dt.datetime,
                       limit: int = 100) -> list[Task]:
        """Tasks whose last allowed attempt lost its worker, each taken over for ``reaper_id``.

        The take-over is a conditional UPDATE (lease still expired, same attempt), so a worker
        that was only slow and renews concurrently is told to stop instead of racing the reaper.
        """
        lost = list(
            self.live().filter(lease_expires_at__lt=now, attempt__gte=1)
            .filter(attempt__gte=F("max_attempts"))
            .order_by("seq")[:limit]
        )
        return [
            task for task in lost
            if self.live().filter(pk=task.pk, attempt=task.attempt, lease_expires_at__lt=now).update(
                worker_id=reaper_id[:64], lease_expires_at=lease_until)
        ]

    def finish(self, outcomes: list[Outcome], *, now: dt.datetime) -> list[int]:
        """Write many runs' outcomes in two statements; returns the pks that changed.

        Must run in a transaction. The rows still live at the run's attempt are locked first
        (a superseded or cancelled run writes nothing), then one UPDATE sets each row's own
        status, message, result and error.
        """
        if not outcomes:
            return []
        match = Q()
        for o in outcomes:
            match |= Q(pk=o.pk, attempt=o.attempt)
        ours = set(self.live().filter(match).select_for_update().values_list("pk", flat=True))
        won = [o for o in outcomes if o.pk in ours]
        if not won:
            return []
        fields: dict[str, tuple[Callable[[Outcome], Any], models.Field[Any, Any]]] = {
            "status": (lambda o: o.status, models.CharField()),
            "status_message": (lambda o: o.message, models.TextField()),
            "result": (lambda o: o.result, models.JSONField()),
            "error": (lambda o: o.error, models.JSONField()),
        }
        updates: dict[str, Any] = {}
        for name, (get, field) in fields.items():
            # Like a single transition: a field the outcome does not set keeps its value.
            whens = [When(pk=o.pk, then=Value(get(o), output_field=field)) for o in won if get(o) is not None]
            if whens:
                updates[name] = Case(*whens, default=F(name), output_field=field)
        self.filter(pk__in=[o.pk for o in won]).update(
            **updates, last_updated_at=now, finished_at=now, lease_expires_at=None
        )
        return [o.pk for o in won]


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
    task_id = models.CharField(max_length=64, unique=True, default=new_task_id, editable=False)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.TASK)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="tasks")
    principal = models.ForeignKey("tenants.Principal", on_delete=models.CASCADE, related_name="tasks")
    session_id = models.CharField(max_length=64, db_index=True)
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.WORKING)
    # null: no message (statusMessage is omitted on the wire), distinct from an empty one.
    status_message = models.TextField(null=True, blank=True)  # noqa: DJ001
    # The original request.
    method = models.CharField(max_length=64, default="tools/call")
    tool_name = models.CharField(max_length=128, db_index=True)
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
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    run_after = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Where server->client messages go: the POST stream of a plain request, or the
    # tasks/result stream that is open for a task right now (null: the session's GET stream).
    stream_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001 - null: the GET stream
    # A retried creation finds the task its first attempt made (mcptasks/idempotency.py): a hash
    # of the client's key or of (session, JSON-RPC id), unique per tenant and principal.
    idempotency_key = models.CharField(max_length=64, null=True, blank=True, editable=False)  # noqa: DJ001
    # The W3C traceparent of the span that created the task (empty while tracing is off), so the
    # worker's spans and a later tasks/result join the creating request's trace.
    traceparent = models.CharField(max_length=55, blank=True, default="")

    objects = TaskQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["status", "lease_expires_at"], name="task_claim_idx"),
            models.Index(fields=["tenant", "principal", "kind", "seq"], name="task_list_idx"),
        ]
        permissions = [("cancel_task", "Can cancel a task (as tasks/cancel does, audited)")]
        constraints = [
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
        """The Task object of the protocol."""
        data: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": _iso(self.created_at),
            "lastUpdatedAt": _iso(self.last_updated_at),
            "ttl": self.ttl_ms,
        }
        if self.status_message:
            data["statusMessage"] = self.status_message
        if self.poll_interval_ms is not None:
            data["pollInterval"] = self.poll_interval_ms
        return data


def _iso(value: Any) -> str:
    # RFC 3339 with milliseconds and a Z suffix.
    return str(value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z")


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


class StreamEvent(models.Model):
    """An SSE event, kept for a retention window so a reconnecting client can replay its stream.

    ``seq`` numbers the events of one stream 1, 2, 3, ... without gaps (see :class:`StreamCursor`),
    so a connection that receives event n+2 before n+1 knows n+1 exists and fetches it.
    """

    id = models.BigAutoField(primary_key=True)
    session_id = models.CharField(max_length=64)
    stream_id = models.CharField(max_length=64)
    seq = models.BigIntegerField(default=0)
    data = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["stream_id", "seq"], name="streamevent_stream_seq_uniq")]

    def __str__(self) -> str:
        return self.event_id

    @property
    def event_id(self) -> str:
        """The SSE ``id``: names the stream so Last-Event-ID finds it."""
        return f"{self.stream_id}.{self.seq}"


class StreamCursor(models.Model):
    """The last sequence number handed out on a stream.

    Appending locks this row, so sequence numbers are gap-free and commit in order; it outlives
    the stream's events (retention) so numbers never restart while a client may resume.
    """

    stream_id = models.CharField(primary_key=True, max_length=64)
    session_id = models.CharField(max_length=64, db_index=True)
    last_seq = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)
    # A tasks/result stream remembers which task and request id it answers for as long as the
    # stream may be resumed (the row lives as long as its session), not in an event that
    # retention deletes: a client can resume it however long the task runs.
    task_id = models.CharField(max_length=64, blank=True, default="")
    rpc_id = models.JSONField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.stream_id}@{self.last_seq}"


class WorkerHeartbeat(models.Model):
    """A live worker process; stale rows show operators which workers died."""

    worker_id = models.CharField(primary_key=True, max_length=64)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    concurrency = models.IntegerField()
    running = models.IntegerField(default=0)
    started_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(db_index=True)
    stopping = models.BooleanField(default=False)
    #: The process's resident memory and asyncio task count at its last heartbeat (``/metrics``).
    rss_bytes = models.BigIntegerField(default=0)
    asyncio_tasks = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.worker_id


class AuditEvent(models.Model):
    """An append-only audit record; sealed later into its chain by :func:`mcptasks.audit.seal`.

    ``chain`` (the tenant id at write time, 0 for none) and ``principal_ref`` are kept apart
    from the foreign keys: deleting a tenant or principal nulls the keys but leaves what was
    sealed, and so the chain, intact.
    """

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.SET_NULL, null=True, related_name="+")
    principal = models.ForeignKey("tenants.Principal", on_delete=models.SET_NULL, null=True, related_name="+")
    chain = models.BigIntegerField(default=0)
    principal_ref = models.BigIntegerField(null=True, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    task_id = models.CharField(max_length=64, blank=True, db_index=True)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # Set by the sealer: position in the chain, link to the previous event, keyed hash.
    chain_seq = models.BigIntegerField(null=True, blank=True)
    prev_hash = models.CharField(max_length=64, blank=True)
    hash = models.CharField(max_length=64, blank=True)
    sealed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["chain", "chain_seq"], name="auditevent_chain_seq_uniq")]
        indexes = [
            models.Index(fields=["id"], name="auditevent_unsealed_idx", condition=models.Q(sealed_at__isnull=True)),
            models.Index(fields=["tenant", "-created_at"], name="auditevent_tenant_time_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.task_id}"


class AuditAnchor(models.Model):
    """A signed record of a chain's head (or of where pruning cut it); exportable."""

    class Kind(models.TextChoices):
        HEAD = "head", "head"
        PRUNE = "prune", "prune"

    chain = models.BigIntegerField()
    seq = models.BigIntegerField()
    head = models.CharField(max_length=64)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.HEAD)
    created_at = models.DateTimeField()
    signature = models.CharField(max_length=64)

    class Meta:
        indexes = [models.Index(fields=["chain", "seq"], name="auditanchor_chain_seq_idx")]

    def __str__(self) -> str:
        return f"{self.kind} anchor of chain {self.chain} at {self.seq}"


def new_webhook_message_id() -> str:
    """The ``webhook-id`` of one event: stable across retries, so receivers can deduplicate."""
    return "msg_" + secrets.token_urlsafe(18)


class WebhookDelivery(models.Model):
    """One task event for one webhook endpoint: the transactional outbox row.

    Written in the transaction of the task's transition (:mod:`mcptasks.webhooks`), so a
    committed transition always has its deliveries and a rolled-back one has none. Workers
    claim due rows with ``FOR UPDATE SKIP LOCKED`` and a lease.
    """

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed (gave up)"

    id = models.BigAutoField(primary_key=True)
    endpoint = models.ForeignKey("tenants.WebhookEndpoint", on_delete=models.CASCADE, related_name="deliveries")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    msg_id = models.CharField(max_length=64, unique=True, default=new_webhook_message_id, editable=False)
    task_id = models.CharField(max_length=64)
    event = models.CharField(max_length=32)
    payload = models.JSONField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.IntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    worker_id = models.CharField(max_length=64, blank=True)
    last_status_code = models.IntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    #: The first bytes of the receiver's last response, for operators (never more).
    response_excerpt = models.CharField(max_length=200, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        indexes = [
            models.Index(fields=["next_attempt_at"], name="webhook_due_idx", condition=Q(state="pending")),
            models.Index(fields=["endpoint", "task_id", "id"], name="webhook_task_order_idx"),
        ]
        permissions = [("redeliver_webhookdelivery", "Can redeliver a webhook delivery (audited)")]

    def __str__(self) -> str:
        return f"{self.event} {self.task_id[:8]}… {self.state}"
