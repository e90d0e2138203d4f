"""The sliding-window counters of :mod:`tenants.ratelimit`: keys, counting one request, and the
estimate that admits or refuses it (with its ``Retry-After``).

One counter per tenant (or penalised principal), class and minute: ``INCR`` with an expiry
(atomic in Redis, lock-protected in the in-process fallback of :mod:`tenants.kv`), estimated as
``previous_minute * (1 - elapsed_fraction) + current_minute``. A refused request is uncounted.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from django.conf import settings

from tenants import kv
from tenants.exceptions import RateLimited

OpClass = Literal["create", "read", "other"]
WINDOW_S = 60
#: A counter outlives its window by one more window (the next one reads it as ``previous``).
COUNTER_TTL_S = WINDOW_S * 2 + 5


def prefix() -> str:
    """The rate limiter's Redis key prefix (per deployment: ``CHANNEL_PREFIX``)."""
    return f"{getattr(settings, 'CHANNEL_PREFIX', 'mcptasks')}:rl"


def counter_key(tenant_id: int | str, op_class: str, window: int) -> str:
    """The counter of ``tenant_id``'s ``op_class`` requests in minute number ``window``."""
    return f"{prefix()}:{tenant_id}:{op_class}:{window}"


def window_at(now: float) -> tuple[int, float]:
    """(this window's number, the weight of the previous window's count now)."""
    window = int(now // WINDOW_S)
    return window, 1.0 - (now - window * WINDOW_S) / WINDOW_S


def refusal(*, previous: int, current: int, limit: int, now: float, op_class: OpClass) -> RateLimited | None:
    """None when ``current`` (this request counted) fits the sliding-window estimate."""
    window, weight = window_at(now)
    if previous * weight + current <= limit:
        return None
    elapsed = now - window * WINDOW_S
    return RateLimited(
        retry_after_s=max(1, math.ceil(retry_after(previous, current - 1, limit, elapsed))),
        limit=limit,
        op_class=op_class,
        window_s=WINDOW_S,
    )


def retry_after(previous: int, current: int, limit: int, elapsed: float) -> float:
    """Seconds until one more request fits the sliding-window estimate (``current``: accepted)."""
    if current + 1 <= limit and previous > 0:
        # Within this window: previous * (1 - (elapsed + t) / W) + current + 1 <= limit.
        return max(0.0, (1 - (limit - 1 - current) / previous) * WINDOW_S - elapsed)
    # In the next window, this window's count decays: current * (1 - s / W) + 1 <= limit.
    decay = max(0.0, 1 - (limit - 1) / current) * WINDOW_S if current > 0 else 0.0
    return (WINDOW_S - elapsed) + decay


def _queue_count(pipe: Any, prev_key: str, key: str) -> None:
    """Queue the counter commands on a (sync or async) pipeline: read the previous window, count this one."""
    pipe.get(prev_key)
    pipe.incr(key)
    pipe.expire(key, COUNTER_TTL_S)


def _counted(out: list[Any]) -> tuple[int, int]:
    """(previous window's count, this window's count) from the replies of :func:`_queue_count`."""
    return int(out[0] or 0), int(out[1])


def local_count(store: kv.LocalStore, prev_key: str, key: str) -> tuple[int, int]:
    """:func:`_queue_count` and :func:`_counted` in the in-process fallback."""
    return int(store.get(prev_key) or 0), store.incr(key, ttl_s=COUNTER_TTL_S)


def _count(prev_key: str, key: str) -> tuple[int, int]:
    """(previous window's count, this window's count after adding one)."""

    def remote(r: Any) -> tuple[int, int]:
        pipe = r.pipeline(transaction=False)
        _queue_count(pipe, prev_key, key)
        return _counted(pipe.execute())

    return kv.call(remote, fallback=lambda store: local_count(store, prev_key, key))


def _uncount(key: str) -> None:
    kv.call(lambda r: r.decr(key), fallback=lambda store: store.incr(key, ttl_s=COUNTER_TTL_S, by=-1))


async def auncount(key: str, *, by: int = 1) -> None:
    """:func:`_uncount` from async code (``by`` requests at once)."""
    await kv.acall(lambda r: r.decrby(key, by), fallback=lambda store: store.incr(key, ttl_s=COUNTER_TTL_S, by=-by))


def charge(*, tenant_id: int | str, op_class: OpClass, limit: int, now: float) -> None:
    """Count one request against ``limit``; raise (uncounted) :class:`RateLimited` when it does not fit."""
    window, _ = window_at(now)
    this = counter_key(tenant_id, op_class, window)
    previous, current = _count(counter_key(tenant_id, op_class, window - 1), this)
    found = refusal(previous=previous, current=current, limit=limit, now=now, op_class=op_class)
    if found is not None:
        _uncount(this)  # refused requests do not count
        raise found


async def acharge(*, tenant_id: int | str, op_class: OpClass, limit: int, now: float) -> None:
    """:func:`charge` from async code."""
    window, _ = window_at(now)
    this, prev_key = counter_key(tenant_id, op_class, window), counter_key(tenant_id, op_class, window - 1)

    async def remote(r: Any) -> tuple[int, int]:
        pipe = r.pipeline(transaction=False)
        _queue_count(pipe, prev_key, this)
        return _counted(await pipe.execute())

    previous, current = await kv.acall(remote, fallback=lambda store: local_count(store, prev_key, this))
    found = refusal(previous=previous, current=current, limit=limit, now=now, op_class=op_class)
    if found is not None:
        await auncount(this)  # refused requests do not count
        raise found
