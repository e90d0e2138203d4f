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
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any, Literal

from django.conf import settings

from . import kv
from .auth import AuthContext
from .exceptions import RateLimited
from .selectors import TenantRow, tenant_row

OpClass = Literal["create", "read", "other"]
WINDOW_S = 60


def _limit_for(auth: AuthContext, op_class: OpClass) -> int | None:
    row = tenant_row(tenant_id=auth.tenant_id)
    return {
        "create": row.rate_create_per_min,
        "read": row.rate_read_per_min,
        "other": row.rate_other_per_min,
    }[op_class]


def _prefix() -> str:
    return f"{getattr(settings, 'CHANNEL_PREFIX', 'mcptasks')}:rl"


def _key(tenant_id: int, op_class: str, window: int) -> str:
    return f"{_prefix()}:{tenant_id}:{op_class}:{window}"


_COUNTER_TTL_S = WINDOW_S * 2 + 5


def _count(prev_key: str, key: str) -> tuple[int, int]:
    """(previous window's count, this window's count after adding one)."""

    def remote(r: Any) -> tuple[int, int]:
        pipe = r.pipeline(transaction=False)
        pipe.get(prev_key)
        pipe.incr(key)
        pipe.expire(key, _COUNTER_TTL_S)
        previous, current, _ = pipe.execute()
        return int(previous or 0), int(current)

    def fallback(store: kv.LocalStore) -> tuple[int, int]:
        return int(store.get(prev_key) or 0), store.incr(key, ttl_s=_COUNTER_TTL_S)

    return kv.call(remote, fallback=fallback)


def _uncount(key: str) -> None:
    kv.call(lambda r: r.decr(key), fallback=lambda store: store.incr(key, ttl_s=_COUNTER_TTL_S, by=-1))


def _window(now: float) -> tuple[int, float]:
    """(this window's number, the weight of the previous window's count now)."""
    window = int(now // WINDOW_S)
    return window, 1.0 - (now - window * WINDOW_S) / WINDOW_S


def _refusal(*, previous: int, current: int, limit: int, now: float, op_class: OpClass) -> RateLimited | None:
    """None when ``current`` (this request counted) fits the sliding-window estimate."""
    window, weight = _window(now)
    if previous * weight + current <= limit:
        return None
    elapsed = now - window * WINDOW_S
    return RateLimited(
        retry_after_s=max(1, math.ceil(_retry_after(previous, current - 1, limit, elapsed))),
        limit=limit,
        op_class=op_class,
        window_s=WINDOW_S,
    )


def _charge(*, tenant_id: int, op_class: OpClass, limit: int, now: float) -> None:
    window, _ = _window(now)
    key = _key(tenant_id, op_class, window)
    previous, current = _count(_key(tenant_id, op_class, window - 1), key)
    refusal = _refusal(previous=previous, current=current, limit=limit, now=now, op_class=op_class)
    if refusal is not None:
        _uncount(key)  # refused requests do not count
        raise refusal


def _retry_after(previous: int, current: int, limit: int, elapsed: float) -> float:
    """Seconds until one more request fits the sliding-window estimate (``current``: accepted)."""
    if current + 1 <= limit and previous > 0:
        # Within this window: previous * (1 - (elapsed + t) / W) + current + 1 <= limit.
        return max(0.0, (1 - (limit - 1 - current) / previous) * WINDOW_S - elapsed)
    # In the next window, this window's count decays: current * (1 - s / W) + 1 <= limit.
    decay = max(0.0, 1 - (limit - 1) / current) * WINDOW_S if current > 0 else 0.0
    return (WINDOW_S - elapsed) + decay


def check_rate(*, auth: AuthContext, op_class: OpClass) -> None:
    """Count one ``op_class`` request of ``auth``'s tenant; raise :class:`RateLimited` if over budget."""
    limit = _limit_for(auth, op_class)
    if limit is None:
        return
    _charge(tenant_id=auth.tenant_id, op_class=op_class, limit=limit, now=time.time())


def _poll_key(*, auth: AuthContext, task_id: str, poll_interval_ms: int) -> tuple[str, int]:
    """The poll note's key (the task id hashed: no client string becomes a key) and its ttl."""
    digest = hashlib.sha256(task_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{_prefix()}:poll:{auth.principal_id}:{digest}", max(WINDOW_S, math.ceil(poll_interval_ms / 1000) * 2)


def note_poll(*, auth: AuthContext, task_id: str, poll_interval_ms: int) -> None:
    """Record a ``tasks/get`` of ``task_id``; a poll sooner than ``poll_interval_ms`` after the
    previous one by the same principal costs one extra read (may raise :class:`RateLimited`).

    Call it in addition to ``check_rate(op_class="read")``. Nothing is recorded for a tenant
    without a read limit (there is nothing to charge). The task id is hashed into the key, so a
    client-chosen string never becomes a Redis key.
    """
    limit = _limit_for(auth, "read")
    if limit is None:
        return
    now = time.time()
    key, ttl = _poll_key(auth=auth, task_id=task_id, poll_interval_ms=poll_interval_ms)
    previous = kv.call(
        lambda r: r.set(key, repr(now), ex=ttl, get=True),
        fallback=lambda store: store.getset(key, repr(now), ttl_s=ttl),
    )
    if previous is None or (now - float(previous)) * 1000 >= poll_interval_ms:
        return
    _charge(tenant_id=auth.tenant_id, op_class="read", limit=limit, now=now)


async def acount_request(
    *, auth: AuthContext, op_class: OpClass, polled_task_id: str | None, poll_interval_ms: int, row: TenantRow
) -> None:
    """``check_rate`` and (for a ``tasks/get``) ``note_poll`` from async code, in one Redis round trip.

    ``row`` is the tenant's limits (:func:`tenants.selectors.cached_tenant_row`). A refused
    request is uncounted, and a too-early poll charged, with one more round trip each.
    """
    limit = {"create": row.rate_create_per_min, "read": row.rate_read_per_min,
             "other": row.rate_other_per_min}[op_class]
    poll = polled_task_id is not None and row.rate_read_per_min is not None
    if limit is None and not poll:
        return
    now = time.time()
    window, _ = _window(now)
    key, prev_key = _key(auth.tenant_id, op_class, window), _key(auth.tenant_id, op_class, window - 1)
    poll_key, poll_ttl = _poll_key(auth=auth, task_id=polled_task_id or "", poll_interval_ms=poll_interval_ms)

    async def remote(r: Any) -> tuple[int, int, Any]:
        pipe = r.pipeline(transaction=False)
        if limit is not None:
            pipe.get(prev_key)
            pipe.incr(key)
            pipe.expire(key, _COUNTER_TTL_S)
        if poll:
            pipe.set(poll_key, repr(now), ex=poll_ttl, get=True)
        out = await pipe.execute()
        counts = (int(out[0] or 0), int(out[1])) if limit is not None else (0, 0)
        return counts[0], counts[1], out[-1] if poll else None

    def local(store: kv.LocalStore) -> tuple[int, int, Any]:
        counts = (int(store.get(prev_key) or 0), store.incr(key, ttl_s=_COUNTER_TTL_S)) if limit is not None else (0, 0)
        return counts[0], counts[1], store.getset(poll_key, repr(now), ttl_s=poll_ttl) if poll else None

    previous, current, last_poll = await kv.acall(remote, fallback=local)
    if limit is not None:
        refusal = _refusal(previous=previous, current=current, limit=limit, now=now, op_class=op_class)
        if refusal is not None:
            await _auncount(key)  # refused requests do not count
            raise refusal
    if poll and last_poll is not None and (now - float(last_poll)) * 1000 < poll_interval_ms:
        # Polling faster than pollInterval costs an extra read.
        read_limit = row.rate_read_per_min
        assert read_limit is not None
        await _acharge(tenant_id=auth.tenant_id, op_class="read", limit=read_limit, now=now)


async def _auncount(key: str) -> None:
    """:func:`_uncount` from async code."""
    await kv.acall(lambda r: r.decr(key), fallback=lambda store: store.incr(key, ttl_s=_COUNTER_TTL_S, by=-1))


async def _acharge(*, tenant_id: int, op_class: OpClass, limit: int, now: float) -> None:
    """:func:`_charge` from async code."""
    window, _ = _window(now)
    key, prev_key = _key(tenant_id, op_class, window), _key(tenant_id, op_class, window - 1)

    async def remote(r: Any) -> tuple[int, int]:
        pipe = r.pipeline(transaction=False)
        pipe.get(prev_key)
        pipe.incr(key)
        pipe.expire(key, _COUNTER_TTL_S)
        previous, current, _ = await pipe.execute()
        return int(previous or 0), int(current)

    previous, current = await kv.acall(
        remote, fallback=lambda store: (int(store.get(prev_key) or 0), store.incr(key, ttl_s=_COUNTER_TTL_S))
    )
    refusal = _refusal(previous=previous, current=current, limit=limit, now=now, op_class=op_class)
    if refusal is not None:
        await _auncount(key)  # refused requests do not count
        raise refusal
