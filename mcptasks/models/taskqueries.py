"""The task data layer: :class:`TaskQuerySet`, whose named transitions are every task state change."""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connection, models, transaction
from django.db.models import Case, F, OuterRef, Q, Subquery, Value, When, Window
from django.db.models.functions import Coalesce, RowNumber
from django.utils import timezone

from mcptasks.db import prepared
from mcptasks.models.claimsql import Claimed, claim_statement
from mcptasks.models.sessions import McpSession
from mcptasks.models.status import LIVE, TERMINAL, TaskStatus
from mcptasks.protocol.messages import sources_for

if TYPE_CHECKING:
    from mcptasks.models.tasks import Task


_renew_statement: str | None = None


def _renew_sql(model: type[Task]) -> str:
    """The lease renewal on PostgreSQL: one statement that locks a worker's live, uncancelled
    runs in key order, extends their leases and answers each renewed row's task id and attempt.

    In key order because a batch of outcomes (:mod:`mcptasks.tasks.finishsql`) locks its rows in
    that order: a renewal that locked the same runs in another order (``task_id IN (...)`` takes
    whatever order its plan scans) waited for the finish while the finish waited for it, and
    PostgreSQL broke the cycle after ``deadlock_timeout`` by failing one of them (issue 27: a
    second's stall of a batch of finished tasks under the e2e load).
    """
    global _renew_statement
    if _renew_statement is None:
        q = connection.ops.quote_name
        # The model is passed in (the QuerySet's own): importing it here would be a cycle.
        table, pk = q(model._meta.db_table), q(str(model._meta.pk.column))
        # Identifiers come from the model's metadata; every value is a bound parameter.
        _renew_statement = (
            f"UPDATE {table} t SET {q('lease_expires_at')} = %s "  # noqa: S608
            f"FROM (SELECT {pk} FROM {table} WHERE {q('task_id')} = ANY(%s) AND {q('worker_id')} = %s "
            f"AND {q('status')} = ANY(%s) AND NOT {q('cancel_requested')} "
            f"ORDER BY {pk} FOR NO KEY UPDATE) mine "
            f"WHERE t.{pk} = mine.{pk} RETURNING t.{q('task_id')}, t.{q('attempt')}"
        )
    return _renew_statement


def tool_lock_key(tool_name: str) -> int:
    """A stable signed 32-bit key for ``pg_advisory_xact_lock`` of one tool's concurrency limit."""
    return zlib.crc32(f"mcptasks.tool:{tool_name}".encode()) - 2**31


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
              tenant_running: dict[int, int] | None = None, tenant_cap: int | None = None) -> Claimed:
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

        On PostgreSQL the claim is one statement (:func:`~mcptasks.models.claimsql.claim_statement`:
        rank, lock with ``SKIP LOCKED``, ``UPDATE … RETURNING``), run in autocommit (without a
        pooler, outside a caller's transaction) unless a claimable task of a tool
        in ``limited`` is among the rows it ranks: counting such a tool's slots needs its advisory lock before the
        claim, so the statement then claims nothing and the claim takes the counted path below
        (rank, lock, update: three statements plus the count of each limited tool) in the same
        transaction. SQLite always takes the counted path. The result's ``passed_over`` says
        whether claimable rows were seen and not taken (see :class:`Claimed`).
        """
        on_pg = connection.vendor == "postgresql"
        # A lease of ours that lapsed (a long stall) must not start a second local run.
        skip = list(exclude)
        held = dict(tenant_running or {})
        capped: list[int] = []
        if tenant_cap is not None:
            capped = [tenant for tenant, n in held.items() if n >= tenant_cap]
        # The statement is atomic by itself: in autocommit its row locks end with it, instead of
        # lasting until a COMMIT sent after Python has built the claimed rows (and BEGIN and
        # COMMIT cost two round trips). Behind a pooler it stays in a transaction: the timeouts
        # are set per transaction there.
        # The statement claims from the whole table: a filtered queryset takes the counted path.
        statement = on_pg and not self.query.has_filters()
        alone = statement and prepared.runs_alone()

        def by_statement() -> tuple[bool, Claimed]:
            return claim_statement(self.model, worker_id=worker_id, limit=limit, now=now, lease_until=lease_until,
                                   held=held, tenant_cap=tenant_cap, limited=sorted(limited or {}), skip=skip,
                                   capped=capped)

        if alone:
            limited_waiting, at_once = by_statement()
            if not limited_waiting:
                return at_once
        with transaction.atomic():
            if statement and not alone:
                limited_waiting, at_once = by_statement()
                if not limited_waiting:
                    return at_once
            # The querysets are built only here: the statement above does not need them, and
            # compiling their filters was a tenth of a worker's CPU under a creation load.
            runnable = self.claimable(now=now)
            if skip:
                runnable = runnable.exclude(task_id__in=skip)
            uncapped = runnable.exclude(tenant_id__in=capped) if capped else runnable
            capacity = runnable._capacity(limited or {}, now=now, on_pg=on_pg)
            full = [name for name, free in capacity.items() if free <= 0]
            base = uncapped.exclude(tool_name__in=full) if full else uncapped
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
            claimed = Claimed()
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
            claimed.passed_over = len(fair) > len(claimed)
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
        """Extend the leases of ``worker_id``'s runs (task id -> attempt) in one UPDATE (on
        PostgreSQL locking them in key order: :func:`_renew_sql`).

        Returns the task ids whose run must stop: cancelled, finished, or taken over by another
        attempt.
        """
        ids = list(runs)
        if connection.vendor == "postgresql":
            with connection.cursor() as cur:
                cur.execute(_renew_sql(self.model), [lease_until, ids, worker_id, list(LIVE)])
                alive = {tid for tid, attempt in cur.fetchall() if attempt == runs[tid]}
            return [tid for tid in ids if tid not in alive]
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
        # Locked in key order, as the finish statement and a lease renewal lock (no deadlock).
        ours = set(self.live().filter(match).order_by("pk").select_for_update().values_list("pk", flat=True))
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
