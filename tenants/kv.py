"""The process-wide Redis client for small shared counters, with a circuit breaker.

Redis is an accelerator here, never a dependency of a request: rate-limit counters and poll
notes go to Redis when it answers within ``REDIS_OP_TIMEOUT_S``, and to an in-process store
otherwise (no ``REDIS_URL``, Redis down, frozen or refusing clients). Each process has one client
with one bounded connection pool (``REDIS_POOL_SIZE``), created on first use; Django's cache is
not used for this because its Redis client is rebuilt per async context, and each instance keeps
its own connections open (one leaked connection per request).

After a failure the breaker stays open for ``REDIS_BREAKER_S``: calls skip Redis at once (no
timeout paid per request) and a warning is logged once per opening. Then one call probes Redis;
success closes the breaker.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from django.conf import settings

from tenants import conf
from tenants.infra import redis_pools
from tenants.infra.redis_url import RedisURLError

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Entries kept by the in-process fallback store (oldest dropped first).
LOCAL_MAX_KEYS = 100_000


class Breaker:
    """A circuit breaker: closed (use the service), open (skip it) for ``open_s`` after a failure."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._open_until = 0.0
        self._probing = False
        self.failures = 0

    def allow(self) -> bool:
        """Whether to try the service now (one caller at a time probes a half-open breaker)."""
        now = time.monotonic()
        with self._lock:
            if self._open_until == 0.0:
                return True
            if now < self._open_until or self._probing:
                return False
            self._probing = True
            return True

    @property
    def is_open(self) -> bool:
        """Whether the service is currently considered unavailable."""
        return self._open_until != 0.0

    def failed(self, exc: BaseException, *, open_s: float) -> None:
        """Record a failure: open (or keep open) the breaker for ``open_s`` seconds."""
        with self._lock:
            was_open = self._open_until != 0.0
            self._open_until = time.monotonic() + open_s
            self._probing = False
            self.failures += 1
        if not was_open:
            logger.warning("%s unavailable (%s: %s); falling back for %.1f s", self.name,
                           type(exc).__name__, str(exc)[:200], open_s)

    def succeeded(self) -> None:
        """Record a success: close the breaker."""
        with self._lock:
            was_open = self._open_until != 0.0
            self._open_until = 0.0
            self._probing = False
        if was_open:
            logger.warning("%s available again", self.name)


class LocalStore:
    """A bounded in-process stand-in for the few Redis commands the counters use."""

    def __init__(self, max_keys: int = LOCAL_MAX_KEYS) -> None:
        self._lock = threading.Lock()
        self._data: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self.max_keys = max_keys

    def _live(self, key: str, now: float) -> Any:
        hit = self._data.get(key)
        if hit is None:
            return None
        if hit[0] <= now:
            del self._data[key]
            return None
        return hit[1]

    def _put(self, key: str, value: Any, ttl_s: float, now: float) -> None:
        self._data[key] = (now + ttl_s, value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_keys:
            self._data.popitem(last=False)

    def get(self, key: str) -> Any:
        """The value, or None when missing or expired."""
        with self._lock:
            return self._live(key, time.monotonic())

    def incr(self, key: str, *, ttl_s: float, by: int = 1) -> int:
        """Add ``by`` to a counter (created with ``ttl_s``), return the new value."""
        now = time.monotonic()
        with self._lock:
            hit = self._data.get(key)
            if hit is None or hit[0] <= now:
                self._put(key, by, ttl_s, now)
                return by
            self._data[key] = (hit[0], int(hit[1]) + by)
            return int(hit[1]) + by

    def getset(self, key: str, value: Any, *, ttl_s: float) -> Any:
        """Store ``value`` and return the previous live value (None if none)."""
        now = time.monotonic()
        with self._lock:
            previous = self._live(key, now)
            self._put(key, value, ttl_s, now)
            return previous

    def clear(self) -> None:
        """Forget everything (tests)."""
        with self._lock:
            self._data.clear()


_lock = threading.Lock()
_client: Any = None
_client_url = ""
breaker = Breaker("Redis (rate limits and poll notes)")
local = LocalStore()


def redis_url() -> str:
    """The Redis URL (``REDIS_URL``), or "" when this process has no Redis."""
    return str(getattr(settings, "REDIS_URL", "") or "")


def key(name: str) -> str:
    """``name`` under this deployment's prefix (``MCPTASKS_CHANNEL_PREFIX``)."""
    return f"{getattr(settings, 'CHANNEL_PREFIX', 'mcptasks')}:{name}"


#: TCP keepalive of Redis connections: probes after this many idle seconds, every 10 s, 3 lost
#: probes close it. A Redis host gone without FIN/RST is noticed in about a minute instead of
#: the OS default (about two hours).
KEEPALIVE_IDLE_S = 30


def keepalive_options() -> dict[str, Any]:
    """redis-py connection options turning TCP keepalives on, with short probe timings."""
    import socket

    timings = {"TCP_KEEPIDLE": KEEPALIVE_IDLE_S, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 3}
    return {
        "socket_keepalive": True,
        "socket_keepalive_options": {getattr(socket, k): v for k, v in timings.items() if hasattr(socket, k)},
    }


def _pool_options() -> dict[str, Any]:
    """One bounded pool's options, for the sync client and each loop's async client."""
    s = conf.get()
    return {
        "max_connections": s.REDIS_POOL_SIZE,
        # Waiting for a free connection counts against the same short budget.
        "timeout": s.REDIS_OP_TIMEOUT_S,
        "socket_timeout": s.REDIS_OP_TIMEOUT_S,
        "socket_connect_timeout": s.REDIS_OP_TIMEOUT_S,
        "health_check_interval": 30,
        **keepalive_options(),
    }


_refused_urls: set[str] = set()


def _new_client(url: str, *, asynchronous: bool) -> Any:
    """A ``redis`` (or ``redis.asyncio``) client on a bounded pool for ``url``, or None when the
    URL is refused: refused by ``manage.py check`` too, a process started anyway runs on the local
    store (logged once per URL, the message carrying no credential)."""
    import redis
    import redis.asyncio as aredis

    try:
        pool = (redis_pools.async_pool if asynchronous else redis_pools.sync_pool)(url, **_pool_options())
    except RedisURLError as exc:
        if url not in _refused_urls:
            _refused_urls.add(url)
            logger.error("%s; rate limits and poll notes stay in this process", exc)
        return None
    return (aredis.Redis if asynchronous else redis.Redis)(connection_pool=pool)


def client() -> Any:
    """The process-wide ``redis.Redis`` client (None without ``REDIS_URL``)."""
    global _client, _client_url
    url = redis_url()
    if not url:
        return None
    with _lock:
        if _client is None or _client_url != url:
            made = _new_client(url, asynchronous=False)
            if made is None:
                return None
            _client, _client_url = made, url
        return _client


def pool_stats() -> dict[str, int]:
    """Connections of the process-wide client: ``open`` (created), ``in_use``, ``max``."""
    c = _client
    if c is None:
        return {"open": 0, "in_use": 0, "max": conf.get().REDIS_POOL_SIZE}
    pool = c.connection_pool
    created = len(getattr(pool, "_connections", ()))
    # The pool's queue holds idle connections and None placeholders for ones never made.
    idle = len([x for x in list(getattr(getattr(pool, "pool", None), "queue", ())) if x is not None])
    return {"open": created, "in_use": max(0, created - idle), "max": int(pool.max_connections)}


def apool_stats() -> dict[str, int]:
    """Connections of the async clients, summed over event loops: ``open``, ``in_use``, ``max`` (per loop)."""
    opened = in_use = 0
    for _url, c in list(_aclients.values()):
        pool = c.connection_pool
        busy = len(getattr(pool, "_in_use_connections", ()) or ())
        opened += busy + len(getattr(pool, "_available_connections", ()) or ())
        in_use += busy
    return {"open": opened, "in_use": in_use, "max": conf.get().REDIS_POOL_SIZE}


def call(op: Callable[[Any], T], *, fallback: Callable[[LocalStore], T]) -> T:
    """Run ``op(redis_client)``, or ``fallback(local)`` when Redis is absent or unavailable."""
    c = client()
    if c is None:
        return fallback(local)
    if not breaker.allow():
        return fallback(local)
    import redis

    try:
        value = op(c)
    except (redis.RedisError, OSError) as exc:
        breaker.failed(exc, open_s=conf.get().REDIS_BREAKER_S)
        return fallback(local)
    breaker.succeeded()
    return value


_aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[str, Any]] = weakref.WeakKeyDictionary()


def aclient() -> Any:
    """This event loop's ``redis.asyncio.Redis`` client (None without ``REDIS_URL``).

    Async connections belong to the loop that opened them, so each loop (one per server
    process; one per test) has its own client, with the same bounded pool and timeouts.
    """
    url = redis_url()
    if not url:
        return None
    loop = asyncio.get_running_loop()
    hit = _aclients.get(loop)
    if hit is not None and hit[0] == url:
        return hit[1]
    c = _new_client(url, asynchronous=True)
    if c is None:
        return None
    _aclients[loop] = (url, c)
    return c


async def acall(op: Callable[[Any], Awaitable[T]], *, fallback: Callable[[LocalStore], T]) -> T:
    """:func:`call` from async code: ``await op(async_client)`` under the same breaker and fallback."""
    c = aclient()
    if c is None or not breaker.allow():
        return fallback(local)
    import redis

    try:
        # The socket timeouts bound each read; this bounds the whole operation (pool wait included).
        # asyncio.timeout, not wait_for: no extra task per operation on the request path.
        async with asyncio.timeout(conf.get().REDIS_OP_TIMEOUT_S * 2):
            value = await op(c)
    except (redis.RedisError, OSError, TimeoutError) as exc:
        breaker.failed(exc, open_s=conf.get().REDIS_BREAKER_S)
        return fallback(local)
    breaker.succeeded()
    return value


def reset() -> None:
    """Drop the client and the local store (tests; after changing ``REDIS_URL``)."""
    global _client, _client_url
    with _lock:
        if _client is not None:
            try:
                _client.close()
                _client.connection_pool.disconnect()
            except Exception:
                logger.debug("closing the Redis client failed", exc_info=True)
        _client = None
        _client_url = ""
        _aclients.clear()
    breaker.succeeded()
    local.clear()
