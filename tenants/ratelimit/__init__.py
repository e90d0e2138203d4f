"""Per-tenant request rate limits, shared across processes through Redis (:mod:`tenants.kv`).

Three operation classes, each with its own per-minute budget on the Tenant row (null:
unlimited): ``create`` (task-augmented requests that create a task), ``read`` (``tasks/get``,
``tasks/list``, ``tasks/result``) and ``other`` (every other MCP request).

Counting uses a sliding-window counter: one counter per tenant, class and minute (``INCR``
with an expiry: atomic in Redis, lock-protected in the in-process fallback), and the
estimate ``previous_minute * (1 - elapsed_fraction) + current_minute``. A refused request
is not counted. Limits are re-read from the database every few seconds (admin edits apply
without restart). A tenant without limits costs no Redis round trip at all. When Redis is
unavailable, counting falls back to this process alone (fail open, with a logged warning):
limits are then enforced per process rather than refused or turned into errors.

Polling: :func:`note_poll` charges one *extra* read when the same principal polls the same
task (``tasks/get``) again sooner than the task's ``pollInterval`` — a client that respects
``pollInterval`` pays one read per poll, one that ignores it pays two.

Here: the entry points. The counters and the estimate are in :mod:`.window`, the async path's
one-round-trip script in :mod:`.batch`, per-principal penalties in :mod:`.penalties`.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

from tenants import kv
from tenants.auth import AuthContext
from tenants.exceptions import RateLimited
from tenants.ratelimit import penalties
from tenants.ratelimit.batch import CountItem, counts
from tenants.ratelimit.window import (
    COUNTER_TTL_S,
    WINDOW_S,
    OpClass,
    acharge,
    auncount,
    charge,
    counter_key,
    local_count,
    prefix,
    refusal,
    window_at,
)
from tenants.selectors import TenantRow, tenant_row

__all__ = ["OpClass", "RateLimited", "acount_request", "check_rate", "note_poll"]


def _limit_of(row: TenantRow, op_class: OpClass) -> int | None:
    """The tenant's per-minute budget for ``op_class`` (None: unlimited)."""
    return {
        "create": row.rate_create_per_min,
        "read": row.rate_read_per_min,
        "other": row.rate_other_per_min,
    }[op_class]


def check_rate(*, auth: AuthContext, op_class: OpClass) -> None:
    """Count one ``op_class`` request of ``auth``'s tenant; raise :class:`RateLimited` if over budget."""
    penalty = penalties.penalty_of(principal_id=auth.principal_id)
    if penalty is not None:
        charge(tenant_id=f"p{auth.principal_id}", op_class=op_class, limit=penalty, now=time.time())
    limit = _limit_of(tenant_row(tenant_id=auth.tenant_id), op_class)
    if limit is None:
        return
    charge(tenant_id=auth.tenant_id, op_class=op_class, limit=limit, now=time.time())


def _poll_key(*, auth: AuthContext, task_id: str, poll_interval_ms: int) -> tuple[str, int]:
    """The poll note's key (the task id hashed: no client string becomes a key) and its ttl."""
    digest = hashlib.sha256(task_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{prefix()}:poll:{auth.principal_id}:{digest}", max(WINDOW_S, math.ceil(poll_interval_ms / 1000) * 2)


def note_poll(*, auth: AuthContext, task_id: str, poll_interval_ms: int) -> bool:
    """Record a ``tasks/get`` of ``task_id``; a poll sooner than ``poll_interval_ms`` after the
    previous one by the same principal costs one extra read (may raise :class:`RateLimited`).

    Call it in addition to ``check_rate(op_class="read")``. Nothing is recorded for a tenant
    without a read limit (there is nothing to charge). The task id is hashed into the key, so a
    client-chosen string never becomes a Redis key. Returns whether the poll came too early.
    """
    limit = _limit_of(tenant_row(tenant_id=auth.tenant_id), "read")
    if limit is None:
        return False
    now = time.time()
    key, ttl = _poll_key(auth=auth, task_id=task_id, poll_interval_ms=poll_interval_ms)
    previous = kv.call(
        lambda r: r.set(key, repr(now), ex=ttl, get=True),
        fallback=lambda store: store.getset(key, repr(now), ttl_s=ttl),
    )
    if previous is None or (now - float(previous)) * 1000 >= poll_interval_ms:
        return False
    charge(tenant_id=auth.tenant_id, op_class="read", limit=limit, now=now)
    return True


async def acount_request(
    *, auth: AuthContext, op_class: OpClass, polled_task_id: str | None, poll_interval_ms: int, row: TenantRow
) -> bool:
    """``check_rate`` and (for a ``tasks/get``) ``note_poll`` from async code, in one Redis round trip.

    ``row`` is the tenant's limits (:func:`tenants.selectors.usable_tenant_row`). The count, the
    poll note and a too-early poll's extra read are one Lua script; only a refusal costs a second
    round trip (to uncount). Returns whether this was a poll sooner than ``pollInterval`` (known
    where the tenant has a read limit).
    """
    penalty = None
    # penalty_of's steps inline: the request path awaits only when the snapshot is stale.
    if penalties.enabled():
        if penalties.stale():
            await penalties.areload()
        penalty = penalties.cached_penalty_of(auth.principal_id)
    if penalty is not None:
        await acharge(tenant_id=f"p{auth.principal_id}", op_class=op_class, limit=penalty, now=time.time())
    limit = _limit_of(row, op_class)
    poll = polled_task_id is not None and row.rate_read_per_min is not None
    if limit is None and not poll:
        return False
    now = time.time()
    window, _ = window_at(now)
    key, prev_key = counter_key(auth.tenant_id, op_class, window), counter_key(auth.tenant_id, op_class, window - 1)
    poll_key, poll_ttl = _poll_key(auth=auth, task_id=polled_task_id or "", poll_interval_ms=poll_interval_ms)
    if poll:
        # A poll is a read: its count and an early poll's charge go to the same counter.
        assert op_class == "read" and limit is not None

    def local(store: kv.LocalStore) -> tuple[int, int, bool]:
        previous, current = local_count(store, prev_key, key) if limit is not None else (0, 0)
        early = poll and _too_early(store.getset(poll_key, repr(now), ttl_s=poll_ttl), now, poll_interval_ms)
        if early:
            store.incr(key, ttl_s=COUNTER_TTL_S)
        return previous, current, early

    # One round trip, shared with the requests counted at the same time: count, note the poll
    # and, if it came too early, charge the extra read.
    item = CountItem(
        keys=(prev_key, key, poll_key),
        args=(COUNTER_TTL_S, int(limit is not None), int(poll), repr(now), poll_ttl, poll_interval_ms),
        local=local,
    )
    previous, current, early = await counts.call(item)
    if limit is not None:
        found = refusal(previous=previous, current=current, limit=limit, now=now, op_class=op_class)
        if found is None and early:
            # Polling faster than pollInterval costs an extra read, refused on its own.
            found = refusal(previous=previous, current=current + 1, limit=limit, now=now, op_class="read")
            if found is not None:
                await auncount(key)  # the charge that did not fit
        elif found is not None:
            await auncount(key, by=1 + int(early))  # refused requests do not count
        if found is not None:
            raise found
    return early


def _too_early(previous: Any, now: float, poll_interval_ms: int) -> bool:
    """Whether a poll at ``now`` came sooner than ``poll_interval_ms`` after ``previous`` (a time or None)."""
    return previous is not None and (now - float(previous)) * 1000 < poll_interval_ms
