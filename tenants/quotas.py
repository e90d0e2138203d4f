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
from typing import Any

from django.db import transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Greatest
from django.db.models.signals import post_save, pre_save

from tenants import conf
from tenants.exceptions import QuotaExceeded
from tenants.models import Principal, Tenant


def default_tenant_limit() -> int | None:
    """The concurrency limit of a tenant without one of its own (``MCPTASKS_TASK_MAX_CONCURRENT``; 0: none)."""
    return conf.get().TASK_MAX_CONCURRENT or None


def acquire_task_slot(*, tenant_id: int, principal_id: int) -> None:
    """Take one concurrency slot for a new non-terminal task of ``principal_id`` in ``tenant_id``.

    Must run inside the caller's ``transaction.atomic()`` that also creates the task, so the
    slot and the task commit or roll back together. On :class:`QuotaExceeded` no counter has
    changed, even if the caller catches the error. Limits are read in the statement that
    increments (under the row lock), so admin edits apply immediately.

    A tenant with no limit at all (none of its own, ``MCPTASKS_TASK_MAX_CONCURRENT`` 0, no
    per-principal limit) is not counted: its creations change no counter and lock no counter row,
    so they never wait for each other. See :func:`count_when_limited` for a limit added later.

    On PostgreSQL one statement reads the limits and increments both counters (tenant row first,
    the order :func:`release_task_slots` locks in, so the two never deadlock); the caller creates
    the task before calling this, so the tenant's row lock is held only until its commit.
    """
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        raise RuntimeError("acquire_task_slot() must be called inside transaction.atomic()")
    fallback = default_tenant_limit()
    if connection.vendor == "postgresql":
        took = _acquire_one_statement(tenant_id=tenant_id, principal_id=principal_id, fallback=fallback)
    else:
        took = _acquire_statements(tenant_id=tenant_id, principal_id=principal_id, fallback=fallback)
    found, tenant_limit, per_principal, tenant_taken, principal_taken = took
    if not found:
        raise QuotaExceeded("Unknown tenant", {"limit": 0, "scope": "tenant"})
    if tenant_limit is None and per_principal is None:
        return  # unlimited: not counted
    if not tenant_taken:
        raise QuotaExceeded(
            f"Too many concurrent tasks for this tenant (limit {tenant_limit}); "
            "wait for a task to finish or cancel one",
            {"limit": tenant_limit, "scope": "tenant"},
        )
    if not principal_taken:
        with connection.cursor() as cursor:
            # Give the tenant's slot back: this transaction holds the row lock, so nobody saw it.
            cursor.execute(f"UPDATE {_table(Tenant)} SET active_tasks = active_tasks - 1 WHERE id = %s",  # noqa: S608
                           [tenant_id])
        raise QuotaExceeded(
            f"Too many concurrent tasks for this principal (limit {per_principal}); "
            "wait for a task to finish or cancel one",
            {"limit": per_principal if per_principal is not None else 0, "scope": "principal"},
        )


#: (tenant found, its effective tenant limit, its per-principal limit, tenant slot taken,
#: principal slot taken).
_Took = tuple[bool, int | None, int | None, bool, bool]


def _acquire_one_statement(*, tenant_id: int, principal_id: int, fallback: int | None) -> _Took:
    tenant_table, principal_table = _table(Tenant), _table(Principal)
    limit = "COALESCE(max_concurrent_tasks, CAST(%(fallback)s AS INTEGER))"
    with transaction.get_connection().cursor() as cursor:
        # Identifiers come from the models' metadata; values are bound parameters. ``cfg`` reads
        # the limits without a lock; ``t`` matches (and so locks) the tenant row only when the
        # tenant has a limit; ``p`` counts the principal only if ``t`` took the tenant's slot.
        cursor.execute(
            f"WITH cfg AS (SELECT {limit} AS tl, max_concurrent_tasks_per_principal AS pl "  # noqa: S608
            f"FROM {tenant_table} WHERE id = %(tenant)s), "
            f"t AS (UPDATE {tenant_table} SET active_tasks = active_tasks + 1 WHERE id = %(tenant)s "
            f"AND ({limit} IS NOT NULL OR max_concurrent_tasks_per_principal IS NOT NULL) "
            f"AND ({limit} IS NULL OR active_tasks < {limit}) RETURNING max_concurrent_tasks_per_principal AS pl), "
            f"p AS (UPDATE {principal_table} SET active_tasks = active_tasks + 1 "
            "WHERE id = %(principal)s AND tenant_id = %(tenant)s AND EXISTS (SELECT 1 FROM t) "
            "AND ((SELECT pl FROM t) IS NULL OR active_tasks < (SELECT pl FROM t)) RETURNING 1) "
            "SELECT EXISTS (SELECT 1 FROM cfg), (SELECT tl FROM cfg), (SELECT pl FROM cfg), "
            "EXISTS (SELECT 1 FROM t), EXISTS (SELECT 1 FROM p)",
            {"tenant": tenant_id, "principal": principal_id, "fallback": fallback},
        )
        row = cursor.fetchone()
    return bool(row[0]), row[1], row[2], bool(row[3]), bool(row[4])


def one_statement_slot_sql(*, tenant: str, principal: str, fallback: str) -> tuple[str, str]:
    """CTEs taking a slot inside a larger PostgreSQL statement, and the condition that it may go on.

    For callers that create a task in the same single statement (no transaction held open
    across a round trip): ``tenant``, ``principal`` and ``fallback`` are the statement's
    placeholders for the tenant id, principal id and :func:`default_tenant_limit`. The CTEs are
    ``quota_cfg`` (the tenant's limits, read without a lock), ``quota_t`` and ``quota_p``; the
    condition holds when the tenant is uncounted (no row locked, nothing written) or when its
    slot was taken. A tenant with a per-principal limit is never taken here (a principal refused
    after the tenant's slot was taken would need that slot given back, which one statement
    cannot do): the condition is false and the caller uses :func:`acquire_task_slot` instead,
    as it does for every other refusal, which then names the limit.
    """
    tenant_table, principal_table = _table(Tenant), _table(Principal)
    limit = _limit_sql(fallback)
    # The per-principal column and the tenant limit are part of the UPDATE's own condition, so
    # PostgreSQL re-checks them on the newest row version after waiting for the row lock.
    ctes = (
        f"{_config_cte(tenant=tenant, fallback=fallback)}, "  # noqa: S608
        f"quota_t AS (UPDATE {tenant_table} SET active_tasks = active_tasks + 1 WHERE id = {tenant} "
        f"AND max_concurrent_tasks_per_principal IS NULL AND {limit} IS NOT NULL AND active_tasks < {limit} "
        "RETURNING 1), "
        f"quota_p AS (UPDATE {principal_table} SET active_tasks = active_tasks + 1 "
        f"WHERE id = {principal} AND tenant_id = {tenant} AND EXISTS (SELECT 1 FROM quota_t) RETURNING 1)"
    )
    # A principal missing from the tenant fails the caller's insert (its foreign key), which
    # rolls the tenant's slot back with the whole statement.
    return ctes, f"{_UNCOUNTED} OR EXISTS (SELECT 1 FROM quota_t)"  # noqa: S608 (constants)


def one_statement_uncounted_sql(*, tenant: str, principal: str, fallback: str) -> tuple[str, str]:
    """The CTE and condition of :func:`one_statement_slot_sql` for a tenant believed uncounted:
    no slot is taken and no counter is written; the condition holds only while the tenant really
    has no limit (one set since it was read makes the caller's statement write nothing, and the
    caller then takes :func:`acquire_task_slot`'s path). ``principal`` is bound as in the
    counted statement, so both take the same parameters.

    The condition also fails, at once, while the tenant's or the principal's row is held
    ``FOR UPDATE`` elsewhere (:data:`_KEY_SHARE`)."""
    return _config_cte(tenant=tenant, fallback=fallback, key_share_with=principal), _UNCOUNTED


def uncounted_rows_sql(*, rows: str, tenant: str, principal: str, fallback: str) -> str:
    """A query of the rows of ``rows`` (a CTE of the caller's statement) whose tenant has no limit
    at all: :func:`one_statement_uncounted_sql`'s condition for many creations in one statement.
    ``tenant``, ``principal`` and ``fallback`` name columns of ``rows`` (the tenant id, the
    principal id and :func:`default_tenant_limit`); a row of an unknown tenant or principal, or
    of one whose row is held ``FOR UPDATE`` elsewhere (:data:`_KEY_SHARE`), is left out too."""
    # Identifiers come from the models' metadata and the caller's constants.
    return (f"SELECT r.* FROM {rows} r JOIN {_table(Tenant)} t ON t.id = r.{tenant} "  # noqa: S608
            f"JOIN {_table(Principal)} p ON p.id = r.{principal} "
            f"WHERE {_limit_sql(f'r.{fallback}', table='t.')} IS NULL AND t.max_concurrent_tasks_per_principal IS NULL "
            f"{_KEY_SHARE}")


#: How an uncounted creation reads its tenant's and principal's rows. The task's foreign keys
#: take this lock anyway (when the insert is checked), and it waits for a row held ``FOR UPDATE``
#: (a recount, a tenant's deletion, a host lost inside such a transaction) for up to
#: ``DB_LOCK_TIMEOUT_MS``. Creations of every uncounted tenant share one statement per batch, so
#: that wait was every tenant's (a 503 for another tenant's creation, CI on issue 27). Taken
#: first and ``SKIP LOCKED``, such a row leaves only its own creation out: its caller's ORM path
#: waits, in its own transaction. A counter update (``FOR NO KEY UPDATE``) does not conflict.
_KEY_SHARE = "FOR KEY SHARE OF t, p SKIP LOCKED"


#: The condition, over ``quota_cfg``, that the tenant has no limit at all.
_UNCOUNTED = "EXISTS (SELECT 1 FROM quota_cfg WHERE tl IS NULL AND pl IS NULL)"


def _limit_sql(fallback: str, *, table: str = "") -> str:
    """The tenant's concurrency limit, its own or the default (``fallback``'s placeholder); its
    column qualified by ``table`` (``"t."``) when given."""
    return f"COALESCE({table}max_concurrent_tasks, CAST({fallback} AS INTEGER))"


def _config_cte(*, tenant: str, fallback: str, key_share_with: str | None = None) -> str:
    """``quota_cfg``: the tenant's limits (``tl``, ``pl``), read without a lock; with
    ``key_share_with`` (a principal id's placeholder), read under :data:`_KEY_SHARE` on the
    tenant's and that principal's rows instead (no row when either is held or missing)."""
    rows = f"{_table(Tenant)} t"
    lock = ""
    if key_share_with is not None:
        rows += f" JOIN {_table(Principal)} p ON p.id = CAST({key_share_with} AS BIGINT)"
        lock = f" {_KEY_SHARE}"
    return (f"quota_cfg AS (SELECT {_limit_sql(fallback, table='t.')} AS tl, "  # noqa: S608
            f"t.max_concurrent_tasks_per_principal AS pl FROM {rows} WHERE t.id = {tenant}{lock})")


def one_statement_release_sql(*, released: str, fallback: str) -> str:
    """CTEs giving slots back inside a larger PostgreSQL statement: :func:`release_task_slots`'s work.

    ``released`` names a CTE (or table) of the statement with one row per slot to give back and
    the columns ``tenant_id`` and ``principal_id``; ``fallback`` is the placeholder of
    :func:`default_tenant_limit`. Only counted tenants and their principals are touched. The
    tenant rows are locked in key order, then the principal rows (the order
    :func:`acquire_task_slot` locks in), and their counters never go below zero. The CTEs are
    named ``quota_r*`` and end without a comma.
    """
    tenant_table, principal_table = _table(Tenant), _table(Principal)
    counted = (f"(CAST({fallback} AS INTEGER) IS NOT NULL OR t.max_concurrent_tasks IS NOT NULL "
               "OR t.max_concurrent_tasks_per_principal IS NOT NULL)")
    # Identifiers come from the models' metadata; the caller binds every value.
    return (
        f"quota_rn AS (SELECT tenant_id, principal_id, count(*) AS n FROM {released} "  # noqa: S608
        "GROUP BY tenant_id, principal_id), "
        f"quota_rtl AS MATERIALIZED (SELECT t.id FROM {tenant_table} t WHERE t.id IN (SELECT tenant_id FROM quota_rn) "
        f"AND {counted} ORDER BY t.id FOR NO KEY UPDATE), "
        f"quota_rt AS (UPDATE {tenant_table} t SET active_tasks = GREATEST(t.active_tasks - s.n, 0) "
        "FROM (SELECT tenant_id, sum(n) AS n FROM quota_rn GROUP BY tenant_id) s "
        "WHERE t.id = s.tenant_id AND t.id IN (SELECT id FROM quota_rtl) AND t.active_tasks > 0), "
        f"quota_rpl AS MATERIALIZED (SELECT p.id FROM {principal_table} p "
        "WHERE p.id IN (SELECT principal_id FROM quota_rn) AND p.tenant_id IN (SELECT id FROM quota_rtl) "
        "ORDER BY p.id FOR NO KEY UPDATE), "
        f"quota_rp AS (UPDATE {principal_table} p SET active_tasks = GREATEST(p.active_tasks - s.n, 0) "
        "FROM (SELECT principal_id, sum(n) AS n FROM quota_rn GROUP BY principal_id) s "
        "WHERE p.id = s.principal_id AND p.id IN (SELECT id FROM quota_rpl) AND p.active_tasks > 0)"
    )


def _acquire_statements(*, tenant_id: int, principal_id: int, fallback: int | None) -> _Took:
    """The same on other databases (SQLite serialises writers), a statement at a time."""
    limits = Tenant.objects.filter(pk=tenant_id).values_list(
        "max_concurrent_tasks", "max_concurrent_tasks_per_principal").first()
    if limits is None:
        return False, None, None, False, False
    tenant_limit = limits[0] if limits[0] is not None else fallback
    per_principal = limits[1]
    if tenant_limit is None and per_principal is None:
        return True, None, None, False, False
    rows = Tenant.objects.filter(pk=tenant_id)
    if tenant_limit is not None:
        rows = rows.filter(active_tasks__lt=tenant_limit)
    if not rows.update(active_tasks=F("active_tasks") + 1):
        return True, tenant_limit, per_principal, False, False
    principal = Principal.objects.filter(pk=principal_id, tenant_id=tenant_id)
    if per_principal is not None:
        principal = principal.filter(active_tasks__lt=per_principal)
    return True, tenant_limit, per_principal, True, bool(principal.update(active_tasks=F("active_tasks") + 1))


def is_counted(limits: tuple[int | None, int | None] | None) -> bool:
    """Whether a tenant with these (``max_concurrent_tasks``, per-principal) limits has counters kept."""
    if limits is None:
        return False
    return default_tenant_limit() is not None or limits[0] is not None or limits[1] is not None


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
    Counters of a tenant without limits are not kept (see :func:`acquire_task_slot`): its rows
    do not match, so nothing is locked or written for it.
    """
    taken = list(slots)
    limited = Q()
    if default_tenant_limit() is None:
        limited = Q(max_concurrent_tasks__isnull=False) | Q(max_concurrent_tasks_per_principal__isnull=False)
    tenants = Counter(t for t, _ in taken)
    for pk in sorted(tenants):
        Tenant.objects.filter(limited, pk=pk, active_tasks__gt=0).update(
            active_tasks=Greatest(F("active_tasks") - tenants[pk], Value(0))
        )
    principals = Counter(p for _, p in taken)
    if principals and default_tenant_limit() is None:
        # Principals of limited tenants only (one read, no lock): a tenant's counters are kept
        # for all of its principals or none.
        counted = set(Principal.objects.filter(
            pk__in=list(principals), tenant__in=Tenant.objects.filter(limited)).values_list("pk", flat=True))
        principals = Counter({pk: n for pk, n in principals.items() if pk in counted})
    for pk in sorted(principals):
        Principal.objects.filter(pk=pk, active_tasks__gt=0).update(
            active_tasks=Greatest(F("active_tasks") - principals[pk], Value(0))
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


# --- a tenant's first concurrency limit ---------------------------------------------------------

_LIMIT_FIELDS = ("max_concurrent_tasks", "max_concurrent_tasks_per_principal")


def _note_counted_before(sender: type[Tenant], instance: Tenant, **_: Any) -> None:
    """``pre_save``: whether the stored tenant already had its counters kept (a new one has not)."""
    adding = instance._state.adding or instance.pk is None
    instance._quota_was_counted = adding or is_counted(  # type: ignore[attr-defined]
        Tenant.objects.filter(pk=instance.pk).values_list(*_LIMIT_FIELDS).first())


def _recount_when_first_limited(sender: type[Tenant], instance: Tenant, created: bool, **_: Any) -> None:
    """``post_save``: a tenant that gets its first concurrency limit has its counters recounted.

    Counters are kept only for tenants with a limit: when one is added, the tasks already running
    are counted from the task table once this commits.
    """
    was_counted = getattr(instance, "_quota_was_counted", True)
    if created or was_counted or not is_counted((instance.max_concurrent_tasks,
                                                 instance.max_concurrent_tasks_per_principal)):
        return
    pk = instance.pk
    transaction.on_commit(lambda: recount_active_tasks(tenant_id=pk))


def connect_recount() -> None:
    """Connect the recount of a newly limited tenant to its saves (the app's ``ready``)."""
    pre_save.connect(_note_counted_before, sender=Tenant, dispatch_uid="tenants.quotas.counted_before")
    post_save.connect(_recount_when_first_limited, sender=Tenant, dispatch_uid="tenants.quotas.recount")
