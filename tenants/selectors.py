"""Read-side helpers: a tenant's effective limits, re-read from the database every few seconds."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from tenants import conf
from tenants import conf as tenant_conf
from tenants.infra.coalesce import refresh_due
from tenants.models import POLL_INTERVAL_MS_LIMIT, TTL_MS_LIMIT, Tenant

_LIMIT_FIELDS = (
    "max_concurrent_tasks",
    "max_concurrent_tasks_per_principal",
    "default_ttl_ms",
    "max_ttl_ms",
    "poll_interval_ms",
    "rate_create_per_min",
    "rate_read_per_min",
    "rate_other_per_min",
)


@dataclass(frozen=True)
class TenantRow:
    """The limit columns of one tenant (None: unset)."""

    max_concurrent_tasks: int | None = None
    max_concurrent_tasks_per_principal: int | None = None
    default_ttl_ms: int | None = None
    max_ttl_ms: int | None = None
    poll_interval_ms: int | None = None
    rate_create_per_min: int | None = None
    rate_read_per_min: int | None = None
    rate_other_per_min: int | None = None


@dataclass(frozen=True)
class TaskLimits:
    """What applies to tasks of one tenant now. ``None`` concurrency means unlimited."""

    default_ttl_ms: int
    max_ttl_ms: int
    poll_interval_ms: int
    max_concurrent_tasks: int | None
    max_concurrent_tasks_per_principal: int | None


_cache: dict[int, tuple[float, TenantRow]] = {}
_lock = threading.Lock()


def tenant_row(*, tenant_id: int) -> TenantRow:
    """The tenant's limit columns, cached in-process for at most ``LIMITS_CACHE_S`` seconds."""
    row = cached_tenant_row(tenant_id=tenant_id)
    return row if row is not None else read_tenant_row(tenant_id=tenant_id)


def cached_tenant_row(*, tenant_id: int) -> TenantRow | None:
    """The tenant's limits if this process read them less than ``LIMITS_CACHE_S`` ago (no I/O)."""
    usable = usable_tenant_row(tenant_id=tenant_id)
    return usable[0] if usable is not None else None


def usable_tenant_row(*, tenant_id: int) -> tuple[TenantRow, bool] | None:
    """The tenant's limits if this process read them less than ``LIMITS_CACHE_S`` ago, and
    whether they are due to be re-read ahead of their lapse (no I/O); None when they lapsed.

    Issue 27: when the row lapsed, every request of the tenant in flight waited for the one that
    re-read it, and its creations in flight took the slower ORM path; 20 tenants lapse 20 times
    as often as one. A caller that is told the row is due has it re-read in the background
    (:func:`read_tenant_row`) while requests go on with the row, which is still within
    ``LIMITS_CACHE_S`` of its read: an admin's edit still applies within ``LIMITS_CACHE_S``.
    """
    with _lock:
        hit = _cache.get(tenant_id)
    if hit is None:
        return None
    fresh_until, row = hit
    left = fresh_until - time.monotonic()
    if left <= 0:
        return None
    return row, refresh_due(left_s=left, ttl_s=conf.get().LIMITS_CACHE_S)


def remember_tenant_row(*, tenant_id: int, row: TenantRow, read_at: float) -> None:
    """Cache ``row``, read at ``read_at`` (``time.monotonic()`` before the read), for ``LIMITS_CACHE_S``.

    An older read never replaces a newer one (two re-reads of the tenant may land out of order).
    """
    ttl = conf.get().LIMITS_CACHE_S
    if ttl <= 0:
        return
    with _lock:
        hit = _cache.get(tenant_id)
        if hit is None or hit[0] < read_at + ttl:
            _cache[tenant_id] = (read_at + ttl, row)


def read_tenant_row(*, tenant_id: int) -> TenantRow:
    """The tenant's limit columns from the database now (an unknown tenant: no limits), cached."""
    now = time.monotonic()
    values = Tenant.objects.filter(pk=tenant_id).values(*_LIMIT_FIELDS).first()
    row = TenantRow(**values) if values else TenantRow()
    remember_tenant_row(tenant_id=tenant_id, row=row, read_at=now)
    return row


def remember_tenant_read(*, tenant_id: int, tenant: Tenant | None, read_at: float) -> TenantRow:
    """:func:`read_tenant_row` for a tenant read elsewhere (None: no such tenant) at ``read_at``
    (``time.monotonic()`` before the read): its limit columns, cached."""
    row = TenantRow(**{name: getattr(tenant, name) for name in _LIMIT_FIELDS}) if tenant is not None else TenantRow()
    remember_tenant_row(tenant_id=tenant_id, row=row, read_at=read_at)
    return row


def clear_limits_cache() -> None:
    """Forget cached tenant limits (tests; after an edit that must apply at once)."""
    with _lock:
        _cache.clear()


def effective_limits(*, tenant_id: int) -> TaskLimits:
    """The tenant's task limits, each falling back to the global ``MCPTASKS_TASK_*`` setting.

    The default ttl is clamped to the max ttl, so a task created without ``ttl`` is always valid.
    Values are at most ``LIMITS_CACHE_S`` seconds old (admin edits apply without restart).
    """
    return limits_of(tenant_row(tenant_id=tenant_id))


def limits_of(row: TenantRow) -> TaskLimits:
    """The task limits of a tenant row (no I/O; see :func:`effective_limits`).

    ttls and pollInterval are clamped to their hard bounds (``tenants.models``), whatever the
    row or the global setting holds: a huge stored bound must never become a datetime overflow
    (-32603) on task creation.
    """
    g = tenant_conf.get()
    max_ttl = row.max_ttl_ms if row.max_ttl_ms is not None else g.TASK_MAX_TTL_MS
    default_ttl = row.default_ttl_ms if row.default_ttl_ms is not None else g.TASK_DEFAULT_TTL_MS
    poll = row.poll_interval_ms if row.poll_interval_ms is not None else g.TASK_POLL_INTERVAL_MS
    max_ttl = _clamp(max_ttl, TTL_MS_LIMIT)
    return TaskLimits(
        default_ttl_ms=min(_clamp(default_ttl, TTL_MS_LIMIT), max_ttl),
        max_ttl_ms=max_ttl,
        poll_interval_ms=_clamp(poll, POLL_INTERVAL_MS_LIMIT),
        max_concurrent_tasks=row.max_concurrent_tasks
        if row.max_concurrent_tasks is not None
        else (g.TASK_MAX_CONCURRENT or None),
        max_concurrent_tasks_per_principal=row.max_concurrent_tasks_per_principal,
    )


def _clamp(value: int, bound: int) -> int:
    return max(0, min(int(value), bound))
