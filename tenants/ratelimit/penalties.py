"""Penalties: a principal flagged as suspicious (enumerating task ids, polling too fast) is held
to a per-principal rate for a while, on top of its tenant's limits (:mod:`tenants.ratelimit`).

Penalties live in one Redis hash (principal id -> "until:rate"); each process re-reads it at most
once per ``LIMITS_CACHE_S``, so the request path pays nothing while nobody is penalised.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from tenants import kv
from tenants.conf import get as get_conf
from tenants.ratelimit.window import WINDOW_S, prefix


def _penalty_key() -> str:
    return f"{prefix()}:penalties"


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


def enabled() -> bool:
    """Whether penalties are on (``FLAG_PENALTY_S``); off, none can exist and nothing is read."""
    return get_conf().FLAG_PENALTY_S > 0


def penalty_of(*, principal_id: int) -> int | None:
    """The per-minute rate ``principal_id`` is held to right now, or None."""
    if not enabled():
        return None
    if _penalties.stale():
        _penalties.load(kv.call(_read_penalties, fallback=_local_penalties))
    return _penalties.rate_of(principal_id)


def cached_penalty_of(principal_id: int) -> int | None:
    """:func:`penalty_of` from this process's snapshot as it is (see :func:`stale`, :func:`areload`)."""
    return _penalties.rate_of(principal_id)


def stale() -> bool:
    """Whether this process's snapshot is due to be read again."""
    return _penalties.stale()


async def areload() -> None:
    """Read the penalties again, from async code."""
    _penalties.load(await kv.acall(_aread_penalties, fallback=_local_penalties))


def clear_penalties() -> None:
    """Forget every penalty (tests, operators)."""
    kv.call(lambda r: r.delete(_penalty_key()), fallback=lambda store: _local_penalty_hash.clear())
    _penalties.read_at = -math.inf
