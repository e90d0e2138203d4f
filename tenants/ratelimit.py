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
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from django.conf import settings

from . import kv
from .auth import AuthContext
from .coalesce import Coalescer
from .conf import get as get_conf
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


def _key(tenant_id: int | str, op_class: str, window: int) -> str:
    return f"{_prefix()}:{tenant_id}:{op_class}:{window}"


_COUNTER_TTL_S = WINDOW_S * 2 + 5


def _queue_count(pipe: Any, prev_key: str, key: str) -> None:
    """Queue the counter commands on a (sync or async) pipeline: read the previous window, count this one."""
    pipe.get(prev_key)
    pipe.incr(key)
    pipe.expire(key, _COUNTER_TTL_S)


def _counted(out: list[Any]) -> tuple[int, int]:
    """(previous window's count, this window's count) from the replies of :func:`_queue_count`."""
    return int(out[0] or 0), int(out[1])


def _local_count(store: kv.LocalStore, prev_key: str, key: str) -> tuple[int, int]:
    """:func:`_queue_count` and :func:`_counted` in the in-process fallback."""
    return int(store.get(prev_key) or 0), store.incr(key, ttl_s=_COUNTER_TTL_S)


def _count(prev_key: str, key: str) -> tuple[int, int]:
    """(previous window's count, this window's count after adding one)."""

    def remote(r: Any) -> tuple[int, int]:
        pipe = r.pipeline(transaction=False)
        _queue_count(pipe, prev_key, key)
        return _counted(pipe.execute())

    return kv.call(remote, fallback=lambda store: _local_count(store, prev_key, key))


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


def _charge(*, tenant_id: int | str, op_class: OpClass, limit: int, now: float) -> None:
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
    penalty = penalty_of(principal_id=auth.principal_id)
    if penalty is not None:
        _charge(tenant_id=f"p{auth.principal_id}", op_class=op_class, limit=penalty, now=time.time())
    limit = _limit_for(auth, op_class)
    if limit is None:
        return
    _charge(tenant_id=auth.tenant_id, op_class=op_class, limit=limit, now=time.time())


def _poll_key(*, auth: AuthContext, task_id: str, poll_interval_ms: int) -> tuple[str, int]:
    """The poll note's key (the task id hashed: no client string becomes a key) and its ttl."""
    digest = hashlib.sha256(task_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{_prefix()}:poll:{auth.principal_id}:{digest}", max(WINDOW_S, math.ceil(poll_interval_ms / 1000) * 2)


def note_poll(*, auth: AuthContext, task_id: str, poll_interval_ms: int) -> bool:
    """Record a ``tasks/get`` of ``task_id``; a poll sooner than ``poll_interval_ms`` after the
    previous one by the same principal costs one extra read (may raise :class:`RateLimited`).

    Call it in addition to ``check_rate(op_class="read")``. Nothing is recorded for a tenant
    without a read limit (there is nothing to charge). The task id is hashed into the key, so a
    client-chosen string never becomes a Redis key. Returns whether the poll came too early.
    """
    limit = _limit_for(auth, "read")
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
    _charge(tenant_id=auth.tenant_id, op_class="read", limit=limit, now=now)
    return True


async def acount_request(
    *, auth: AuthContext, op_class: OpClass, polled_task_id: str | None, poll_interval_ms: int, row: TenantRow
) -> bool:
    """``check_rate`` and (for a ``tasks/get``) ``note_poll`` from async code, in one Redis round trip.

    ``row`` is the tenant's limits (:func:`tenants.selectors.cached_tenant_row`). The count, the
    poll note and a too-early poll's extra read are one Lua script; only a refusal costs a second
    round trip (to uncount). Returns whether this was a poll sooner than ``pollInterval`` (known
    where the tenant has a read limit).
    """
    penalty = None
    if get_conf().FLAG_PENALTY_S > 0:  # off: no penalty can exist, nothing to read
        if _penalties.stale():
            _penalties.load(await kv.acall(_aread_penalties, fallback=_local_penalties))
        penalty = _penalties.rate_of(auth.principal_id)
    if penalty is not None:
        await _acharge(tenant_id=f"p{auth.principal_id}", op_class=op_class, limit=penalty, now=time.time())
    limit = {"create": row.rate_create_per_min, "read": row.rate_read_per_min,
             "other": row.rate_other_per_min}[op_class]
    poll = polled_task_id is not None and row.rate_read_per_min is not None
    if limit is None and not poll:
        return False
    now = time.time()
    window, _ = _window(now)
    key, prev_key = _key(auth.tenant_id, op_class, window), _key(auth.tenant_id, op_class, window - 1)
    poll_key, poll_ttl = _poll_key(auth=auth, task_id=polled_task_id or "", poll_interval_ms=poll_interval_ms)
    if poll:
        # A poll is a read: its count and an early poll's charge go to the same counter.
        assert op_class == "read" and limit is not None

    def local(store: kv.LocalStore) -> tuple[int, int, bool]:
        previous, current = _local_count(store, prev_key, key) if limit is not None else (0, 0)
        early = poll and _too_early(store.getset(poll_key, repr(now), ttl_s=poll_ttl), now, poll_interval_ms)
        if early:
            store.incr(key, ttl_s=_COUNTER_TTL_S)
        return previous, current, early

    # One round trip, shared with the requests counted at the same time: count, note the poll
    # and, if it came too early, charge the extra read.
    item = _CountItem(
        keys=(prev_key, key, poll_key),
        args=(_COUNTER_TTL_S, int(limit is not None), int(poll), repr(now), poll_ttl, poll_interval_ms),
        local=local,
    )
    previous, current, early = await _counts.call(item)
    if limit is not None:
        refusal = _refusal(previous=previous, current=current, limit=limit, now=now, op_class=op_class)
        if refusal is None and early:
            # Polling faster than pollInterval costs an extra read, refused on its own.
            refusal = _refusal(previous=previous, current=current + 1, limit=limit, now=now, op_class="read")
            if refusal is not None:
                await _auncount(key)  # the charge that did not fit
        elif refusal is not None:
            await _auncount(key, by=1 + int(early))  # refused requests do not count
        if refusal is not None:
            raise refusal
    return early


def _too_early(previous: Any, now: float, poll_interval_ms: int) -> bool:
    """Whether a poll at ``now`` came sooner than ``poll_interval_ms`` after ``previous`` (a time or None)."""
    return previous is not None and (now - float(previous)) * 1000 < poll_interval_ms


#: Any number of counts at once, in order. Per count, KEYS: previous window, this window, poll
#: note; ARGV: counter ttl, count?, poll?, now, poll note ttl, poll interval (ms). Returns, per
#: count, {previous count, this count (before any charge), charged?}: the same as running them
#: one after the other.
_COUNT_LUA = """
local out = {}
for i = 0, #KEYS / 3 - 1 do
  local k, a = i * 3, i * 6
  local previous, current, charged = 0, 0, 0
  if ARGV[a + 2] == '1' then
    previous = tonumber(redis.call('GET', KEYS[k + 1]) or '0')
    current = redis.call('INCR', KEYS[k + 2])
    redis.call('EXPIRE', KEYS[k + 2], ARGV[a + 1])
  end
  if ARGV[a + 3] == '1' then
    local last = redis.call('SET', KEYS[k + 3], ARGV[a + 4], 'EX', ARGV[a + 5], 'GET')
    if last and (tonumber(ARGV[a + 4]) - tonumber(last)) * 1000 < tonumber(ARGV[a + 6]) then
      redis.call('INCR', KEYS[k + 2])
      charged = 1
    end
  end
  out[#out + 1] = previous
  out[#out + 1] = current
  out[#out + 1] = charged
end
return out
"""


@dataclass(frozen=True)
class _CountItem:
    """One request's count for :data:`_counts`: the script's keys and arguments, and the same
    count on the in-process store (used when Redis is unavailable)."""

    keys: tuple[str, str, str]
    args: tuple[Any, ...]
    local: Callable[[kv.LocalStore], tuple[int, int, bool]]


async def _count_batch(batch: Sequence[_CountItem]) -> list[tuple[int, int, bool]]:
    """The counts of ``batch`` in one script call (each on the local store without Redis)."""

    async def remote(r: Any) -> list[tuple[int, int, bool]]:
        out = await _count_script(r)(
            keys=[k for item in batch for k in item.keys], args=[a for item in batch for a in item.args]
        )
        return [(int(out[i] or 0), int(out[i + 1]), bool(out[i + 2])) for i in range(0, len(out), 3)]

    return await kv.acall(remote, fallback=lambda store: [item.local(store) for item in batch])


#: Counts made at the same time on one event loop share one round trip (see tenants.coalesce).
_counts: Coalescer[_CountItem, tuple[int, int, bool]] = Coalescer(_count_batch, max_batch=32)

_scripts: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _count_script(client: Any) -> Any:
    """The counting script registered on ``client`` (EVALSHA, loaded again after a Redis restart)."""
    script = _scripts.get(client)
    if script is None:
        script = _scripts[client] = client.register_script(_COUNT_LUA)
    return script


async def _auncount(key: str, *, by: int = 1) -> None:
    """:func:`_uncount` from async code."""
    await kv.acall(lambda r: r.decrby(key, by), fallback=lambda store: store.incr(key, ttl_s=_COUNTER_TTL_S, by=-by))


async def _acharge(*, tenant_id: int | str, op_class: OpClass, limit: int, now: float) -> None:
    """:func:`_charge` from async code."""
    window, _ = _window(now)
    key, prev_key = _key(tenant_id, op_class, window), _key(tenant_id, op_class, window - 1)

    async def remote(r: Any) -> tuple[int, int]:
        pipe = r.pipeline(transaction=False)
        _queue_count(pipe, prev_key, key)
        return _counted(await pipe.execute())

    previous, current = await kv.acall(remote, fallback=lambda store: _local_count(store, prev_key, key))
    refusal = _refusal(previous=previous, current=current, limit=limit, now=now, op_class=op_class)
    if refusal is not None:
        await _auncount(key)  # refused requests do not count
        raise refusal


# --- penalties ------------------------------------------------------------------------------
# A principal flagged as suspicious (enumerating task ids, polling too fast) can be held to a
# per-principal rate for a while, on top of its tenant's limits. Penalties live in one Redis
# hash (principal id -> "until:rate"); each process re-reads it at most once per
# ``LIMITS_CACHE_S``, so the request path pays nothing while nobody is penalised.


def _penalty_key() -> str:
    return f"{_prefix()}:penalties"


class _Penalties:
    """This process's snapshot of the penalties hash."""

    def __init__(self) -> None:
        self.rates: dict[int, tuple[float, int]] = {}
        self.read_at = -math.inf

    def stale(self) -> bool:
        return time.monotonic() - self.read_at > get_conf().LIMITS_CACHE_S

    def load(self, raw: dict[Any, Any]) -> None:
        rates: dict[int, tuple[float, int]] = {}
        for pid, value in (raw or {}).items():
            try:
                until, rate = str(value.decode() if isinstance(value, bytes) else value).split(":")
                rates[int(pid)] = (float(until), int(rate))
            except (ValueError, AttributeError):
                continue
        self.rates, self.read_at = rates, time.monotonic()

    def rate_of(self, principal_id: int) -> int | None:
        hit = self.rates.get(principal_id)
        return hit[1] if hit is not None and hit[0] > time.time() else None


_penalties = _Penalties()
_local_penalty_lock = threading.Lock()
_local_penalty_hash: dict[str, str] = {}


def _read_penalties(r: Any) -> dict[Any, Any]:
    return dict(r.hgetall(_penalty_key()))


async def _aread_penalties(r: Any) -> dict[Any, Any]:
    return dict(await r.hgetall(_penalty_key()))


def _local_penalties(store: kv.LocalStore) -> dict[Any, Any]:
    with _local_penalty_lock:
        return dict(_local_penalty_hash)


def penalize(*, principal_id: int, seconds: int, rate_per_min: int) -> None:
    """Hold ``principal_id`` to ``rate_per_min`` requests per minute per class for ``seconds``."""
    until = time.time() + seconds
    value = f"{until:.3f}:{max(1, rate_per_min)}"

    def remote(r: Any) -> None:
        pipe = r.pipeline(transaction=False)
        pipe.hset(_penalty_key(), str(principal_id), value)
        pipe.expire(_penalty_key(), seconds + WINDOW_S)
        pipe.execute()

    def local(store: kv.LocalStore) -> None:
        with _local_penalty_lock:
            _local_penalty_hash[str(principal_id)] = value

    kv.call(remote, fallback=local)
    _penalties.read_at = -math.inf  # this process applies it at once


def penalty_of(*, principal_id: int) -> int | None:
    """The per-minute rate ``principal_id`` is held to right now, or None."""
    if get_conf().FLAG_PENALTY_S <= 0:
        return None
    if _penalties.stale():
        _penalties.load(kv.call(_read_penalties, fallback=_local_penalties))
    return _penalties.rate_of(principal_id)


def clear_penalties() -> None:
    """Forget every penalty (tests, operators)."""
    kv.call(lambda r: r.delete(_penalty_key()), fallback=lambda store: _local_penalty_hash.clear())
    _penalties.read_at = -math.inf
