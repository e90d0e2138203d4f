"""Concurrency quotas: non-terminal tasks per tenant and per principal.

The counters ``Tenant.active_tasks`` and ``Principal.active_tasks`` change only through
single-row conditional UPDATEs (``SET n = n + 1 WHERE n < limit``). The database applies the
condition to the latest committed row version while holding the row lock (PostgreSQL
re-checks the WHERE clause after waiting for a concurrent writer; SQLite serialises writers),
so two processes can never both take the last slot. Nothing is read and then written.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest

from . import conf
from .exceptions import QuotaExceeded
from .models import Principal, Tenant


def default_tenant_limit() -> int | None:
    """The concurrency limit of a tenant without one of its own (``MCPTASKS_TASK_MAX_CONCURRENT``; 0: none)."""
    return conf.get().TASK_MAX_CONCURRENT or None


def acquire_task_slot(*, tenant_id: int, principal_id: int) -> None:
    """Take one concurrency slot for a new non-terminal task of ``principal_id`` in ``tenant_id``.

    Must run inside the caller's ``transaction.atomic()`` that also creates the task, so the
    slot and the task commit or roll back together. On :class:`QuotaExceeded` no counter has
    changed, even if the caller catches the error. Limits are read in the statements that
    increment (the tenant's per-principal limit comes back from its UPDATE, under the row lock),
    so admin edits apply immediately.

    Two statements, tenant row first (the order :func:`release_task_slots` locks in, so the two
    never deadlock): creating a task is on every client's path, and the ORM form of this (a
    savepoint, two UPDATEs, a SELECT, the release) cost several times the round trips.
    """
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        raise RuntimeError("acquire_task_slot() must be called inside transaction.atomic()")
    tenant_table, principal_table = _table(Tenant), _table(Principal)
    fallback = default_tenant_limit()
    with connection.cursor() as cursor:
        # Identifiers come from the models' metadata; values are bound parameters. A tenant
        # without a limit of its own gets the process-wide default (None: unlimited).
        cursor.execute(
            f"UPDATE {tenant_table} SET active_tasks = active_tasks + 1 "  # noqa: S608
            "WHERE id = %s AND (COALESCE(max_concurrent_tasks, CAST(%s AS INTEGER)) IS NULL "
            "OR active_tasks < COALESCE(max_concurrent_tasks, CAST(%s AS INTEGER))) "
            "RETURNING max_concurrent_tasks_per_principal",
            [tenant_id, fallback, fallback],
        )
        took = cursor.fetchone()
        if took is None:
            own = Tenant.objects.filter(pk=tenant_id).values_list("max_concurrent_tasks", flat=True).first()
            limit = own if own is not None else fallback
            if own is None and not Tenant.objects.filter(pk=tenant_id).exists():
                raise QuotaExceeded("Unknown tenant", {"limit": 0, "scope": "tenant"})
            raise QuotaExceeded(
                f"Too many concurrent tasks for this tenant (limit {limit}); "
                "wait for a task to finish or cancel one",
                {"limit": limit, "scope": "tenant"},
            )
        per_principal = took[0]
        below_limit, params = ("", []) if per_principal is None else (" AND active_tasks < %s", [per_principal])
        cursor.execute(
            f"UPDATE {principal_table} SET active_tasks = active_tasks + 1 "  # noqa: S608
            f"WHERE id = %s AND tenant_id = %s{below_limit}",
            [principal_id, tenant_id, *params],
        )
        if cursor.rowcount != 1:
            # Give the tenant's slot back: this transaction holds the row lock, so nobody saw it.
            cursor.execute(f"UPDATE {tenant_table} SET active_tasks = active_tasks - 1 WHERE id = %s",  # noqa: S608
                           [tenant_id])
            raise QuotaExceeded(
                f"Too many concurrent tasks for this principal (limit {per_principal}); "
                "wait for a task to finish or cancel one",
                {"limit": per_principal if per_principal is not None else 0, "scope": "principal"},
            )


def _table(model: type[Tenant] | type[Principal]) -> str:
    return str(transaction.get_connection().ops.quote_name(model._meta.db_table))


def release_task_slot(*, tenant_id: int, principal_id: int) -> None:
    """Give back the slot of a task that reached a terminal status (or was deleted unfinished).

    Call exactly once per acquired slot, in the transaction that makes the task terminal.
    Counters never go below zero.
    """
    release_task_slots(slots=[(tenant_id, principal_id)])


def release_task_slots(*, slots: Iterable[tuple[int, int]]) -> None:
    """Give back several slots at once: ``slots`` names (tenant_id, principal_id) once per slot.

    One UPDATE per tenant and per principal, in key order (concurrent releasers never deadlock).
    """
    taken = list(slots)
    for model, counts in ((Tenant, Counter(t for t, _ in taken)), (Principal, Counter(p for _, p in taken))):
        for pk in sorted(counts):
            model.objects.filter(pk=pk, active_tasks__gt=0).update(
                active_tasks=Greatest(F("active_tasks") - counts[pk], Value(0))
            )


def recount_active_tasks(*, tenant_id: int | None = None, kinds: tuple[str, ...] = ("task", "request")) -> int:
    """Repair the counters from the Task table (after a crash or manual edits); returns rows fixed.

    Counts ``mcptasks.Task`` rows of ``kinds`` whose status is not terminal. Run while no
    task is being created for the tenant (e.g. from a management command).
    """
    from django.apps import apps
    from django.db.models import Count

    task_model = apps.get_model("mcptasks", "Task")
    terminal = ("completed", "failed", "cancelled")
    fixed = 0
    with transaction.atomic():
        tenants = Tenant.objects.select_for_update()
        if tenant_id is not None:
            tenants = tenants.filter(pk=tenant_id)
        for tenant in tenants:
            live = task_model.objects.filter(tenant_id=tenant.pk, kind__in=kinds).exclude(status__in=terminal)
            total = live.count()
            if tenant.active_tasks != total:
                Tenant.objects.filter(pk=tenant.pk).update(active_tasks=total)
                fixed += 1
            per = dict(live.values("principal_id").annotate(n=Count("pk")).values_list("principal_id", "n"))
            for principal in Principal.objects.select_for_update().filter(tenant_id=tenant.pk):
                want = per.get(principal.pk, 0)
                if principal.active_tasks != want:
                    Principal.objects.filter(pk=principal.pk).update(active_tasks=want)
                    fixed += 1
    return fixed
