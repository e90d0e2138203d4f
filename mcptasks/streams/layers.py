"""The Redis channel layer, bounded and observable, and the process's view of its health.

channels-redis builds one connection pool per event loop with redis-py's defaults: an
unbounded wait is not possible there, and redis-py 8 refuses the 101st simultaneous command with
``MaxConnectionsError`` (an HTTP 500 under load). This layer uses a *blocking* pool instead:
``REDIS_LAYER_POOL_SIZE`` connections per event loop, and a caller waits up to
``REDIS_LAYER_POOL_TIMEOUT_S`` for a free one. Socket timeouts come from settings and must
exceed the layer's 5 s blocking read (redis-py 8's default of 5 s equals it, which made every
stream quiet for 5 s fail its receive).

Everything that uses the layer reports failures here (:func:`report_failure`). Listeners (open
SSE streams, the worker) then stop trusting their group memberships: they fall back to
re-reading the database and rejoin their groups once Redis answers again (a Redis that
restarted empty has forgotten every membership).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from channels_redis.core import RedisChannelLayer as _BaseRedisChannelLayer

from tenants import kv
from tenants.infra import redis_pools
from tenants.kv import Breaker

logger = logging.getLogger(__name__)

#: Sends through the layer are skipped for a short while after one failed (no timeout paid per
#: request); receivers recover what they missed from the database.
send_breaker = Breaker("channel layer (Redis)")


#: Per key (a group's sorted set of channels, scored by join time): how many joined after ARGV[1].
_LIVE_MEMBER_COUNTS = """
local counts = {}
for i, key in ipairs(KEYS) do counts[i] = redis.call('ZCOUNT', key, ARGV[1], '+inf') end
return counts
"""


class LayerListener(Protocol):
    """Something that holds group memberships in this process."""

    def layer_failed(self) -> None:
        """The layer failed: memberships may be gone; re-read the store and rejoin."""


_listeners: weakref.WeakSet[Any] = weakref.WeakSet()


def add_listener(listener: LayerListener) -> None:
    """Call ``listener.layer_failed()`` whenever this process sees the layer fail."""
    _listeners.add(listener)


def remove_listener(listener: LayerListener) -> None:
    """Stop notifying ``listener``."""
    _listeners.discard(listener)


def forget_channel(layer: Any, channel: str | None) -> None:
    """Tell the layer that ``channel``'s owner has ended (a no-op for layers without buffers)."""
    forget = getattr(layer, "forget_channel", None)
    if channel and callable(forget):
        forget(channel)


def report_failure(exc: BaseException, *, open_s: float) -> None:
    """A layer operation failed: open the send breaker and tell every listener."""
    send_breaker.failed(exc, open_s=open_s)
    for listener in list(_listeners):
        try:
            listener.layer_failed()
        except Exception:
            logger.debug("layer failure listener raised", exc_info=True)


def _breaker_s() -> float:
    from tenants import conf as tenant_conf

    return tenant_conf.get().REDIS_BREAKER_S


#: The outcome of this process's latest readiness probe of Redis (None: not probed yet).
_last_probe_ok: bool | None = None


def record_redis_probe(ok: bool) -> bool:
    """Record a readiness probe of Redis; returns whether Redis now counts as degraded.

    A probe that got through proves Redis answers again: the breakers close at once instead of
    after their own next probe (what ``/readyz`` and ``/metrics`` report agrees).
    """
    global _last_probe_ok
    _last_probe_ok = ok
    if ok:
        send_breaker.succeeded()
        kv.breaker.succeeded()
    return redis_degraded()


def redis_degraded() -> bool:
    """Whether this process serves without Redis: the last probe failed, or a breaker is open."""
    if not kv.redis_url():
        return False
    return _last_probe_ok is False or send_breaker.is_open or kv.breaker.is_open


#: A channel named by ``new_channel`` that nobody has received on for this long is taken for
#: ended even if its owner never called :func:`forget_channel` (a consumer that does not know it).
CHANNEL_IDLE_S = 300.0


class _ReceiveBuffers(dict[str, Any]):
    """channels-redis's per-channel receive buffers, kept only for channels live in this process.

    The layer's shared receive loop files every message it pops under its channel's name, and
    channels-redis creates that channel's queue on first use. For a channel whose consumer had
    already ended (a stream closed while a notification was on its way, or still a member of a
    group whose discard failed) nobody ever read or removed that queue: the web process kept one
    queue and its messages per such channel, for ever (the steady growth of bench/soak.py). A
    queue is stored here only for a live channel; a message for any other one is dropped.
    """

    def __init__(self, factory: Callable[[], Any], is_live: Callable[[str], bool]) -> None:
        super().__init__()
        self._factory = factory
        self._is_live = is_live

    def __missing__(self, channel: str) -> Any:
        queue = self._factory()
        if self._is_live(channel):
            self[channel] = queue
        return queue


class RedisChannelLayer(_BaseRedisChannelLayer):
    """channels-redis with a bounded blocking connection pool per event loop, and receive buffers
    that never outlive their channel (:class:`_ReceiveBuffers`)."""

    def __init__(self, *args: Any, pool_size: int = 50, pool_timeout: float = 5.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool_size = pool_size
        self.pool_timeout = pool_timeout
        #: Channels this process named and has not forgotten, with when they last received.
        self.live_channels: dict[str, float] = {}
        self._receiving: Counter[str] = Counter()
        self._swept_at = time.monotonic()
        factory: Callable[[], Any] = getattr(self, "receive_buffer").default_factory  # noqa: B009 (a defaultdict)
        self.receive_buffer: _ReceiveBuffers = _ReceiveBuffers(factory, self._is_live)

    def _is_live(self, channel: str) -> bool:
        return channel in self._receiving or channel in self.live_channels

    async def new_channel(self, prefix: str = "specific") -> str:
        """A process-local channel name, live until :meth:`forget_channel` (or idle for long)."""
        name: str = await super().new_channel(prefix)
        self.live_channels[name] = time.monotonic()
        return name

    def forget_channel(self, channel: str) -> None:
        """``channel``'s owner has ended: drop its buffered messages and any that still arrive."""
        self.live_channels.pop(channel, None)
        if channel not in self._receiving:
            self.receive_buffer.pop(channel, None)

    async def receive(self, channel: str) -> Any:
        """channels-redis's receive, keeping ``channel`` live while it is received on."""
        self._receiving[channel] += 1
        try:
            return await super().receive(channel)
        finally:
            self._receiving[channel] -= 1
            if self._receiving[channel] <= 0:
                del self._receiving[channel]
            now = time.monotonic()
            if channel in self.live_channels:
                self.live_channels[channel] = now
            if now - self._swept_at > CHANNEL_IDLE_S / 10:
                self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Forget channels idle for CHANNEL_IDLE_S and drop buffers of channels no longer live."""
        self._swept_at = now
        for channel, seen in list(self.live_channels.items()):
            if now - seen > CHANNEL_IDLE_S and channel not in self._receiving:
                del self.live_channels[channel]
        for channel in [c for c in self.receive_buffer if not self._is_live(c)]:
            del self.receive_buffer[channel]

    def buffer_stats(self) -> dict[str, int]:
        """Live channels and the receive buffers held for them (``/metrics``)."""
        return {"live_channels": len(self.live_channels), "buffers": len(self.receive_buffer),
                "buffered_messages": sum(q.qsize() for q in list(self.receive_buffer.values()))}

    async def groups_with_members(self, groups: Iterable[str]) -> set[str]:
        """Those of ``groups`` that have a live member now: one command per Redis host.

        channels-redis's ``group_send`` costs two round trips to find a group empty; a worker's
        batch of finishes sends to two groups per task (the stream push and the task signal)
        that nobody is in unless a client listens. One script counts the members of every
        group of a host that joined within the group expiry, as ``group_send`` counts them
        (it drops the older ones; this check only reads). A pipeline of two commands per group
        cost the worker about a tenth of its CPU under load in redis-py's encoding and parsing.
        A member that joins right after this check misses the message, exactly as one joining
        right after ``group_send`` read the group would.
        """
        by_host: dict[int, list[str]] = {}
        for group in dict.fromkeys(groups):
            self.require_valid_group_name(group)  # raises TypeError for a bad name
            by_host.setdefault(self.consistent_hash(group), []).append(group)
        found: set[str] = set()
        # Exclusive: group_send drops a member whose score is the cut-off itself.
        newer_than = f"({int(time.time()) - self.group_expiry}"
        for index, names in by_host.items():
            conn = self.connection(index)
            # EVALSHA, with the script loaded again after a NOSCRIPT (a restarted Redis).
            script = conn.register_script(_LIVE_MEMBER_COUNTS)
            counts = await script(keys=[self._group_key(g) for g in names], args=[newer_than], client=conn)
            found.update(group for group, n in zip(names, counts, strict=True) if n)
        return found

    def create_pool(self, index: int) -> Any:
        """A blocking pool for host ``index`` (the host dict carries socket options).

        ``address`` may be any supported ``REDIS_URL``: a ``redis+sentinel://`` one gives a
        Sentinel-managed pool that follows the primary through a failover (see tenants.infra.redis_sentinel).
        """
        host = dict(self.hosts[index])
        address = host.pop("address")
        return redis_pools.async_pool(address, max_connections=self.pool_size, timeout=self.pool_timeout, **host)

    async def _clean_receive_backup(self, index: int, channel: str) -> None:
        """channels-redis's fire-and-forget clean-up after a receive, with its failure handled.

        It runs as an unawaited task: on a Redis that just failed over its error was logged as
        "Task exception was never retrieved". The message is already delivered; a backup entry left
        behind only costs a duplicate after a later failure, so the error is reported, not raised.
        """
        try:
            await super()._clean_receive_backup(index, channel)
        except Exception as exc:
            report_failure(exc, open_s=_breaker_s())

    async def probe(self) -> None:
        """Readiness: one short-lived write through this loop's pool (raises when Redis does not take it).

        A write, so a primary demoted to a read-only replica fails it. Not a send and receive: a
        probe cancelled by its timeout inside channels-redis's receive left that receive path
        stuck after a failover, and ``/readyz`` answered 503 until the process was restarted.
        """
        await self.connection(0).set(f"{self.prefix}readyz:{self.client_prefix}", b"1", ex=10)

    def pool_stats(self) -> dict[str, int]:
        """Connections over every event loop's pools: ``open``, ``in_use``, ``max`` (per loop)."""
        created = in_use = 0
        for loop_layer in list(self._layers.values()):
            for conn in list(loop_layer._connections.values()):
                pool = conn.connection_pool
                busy = len(getattr(pool, "_in_use_connections", ()) or ())
                created += busy + len(getattr(pool, "_available_connections", ()) or ())
                in_use += busy
        return {"open": created, "in_use": in_use, "max": self.pool_size}
