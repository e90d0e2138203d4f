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
import weakref
from typing import Any, Protocol

from channels_redis.core import RedisChannelLayer as _BaseRedisChannelLayer
from redis import asyncio as aioredis

from tenants.kv import Breaker

logger = logging.getLogger(__name__)

#: Sends through the layer are skipped for a short while after one failed (no timeout paid per
#: request); receivers recover what they missed from the database.
send_breaker = Breaker("channel layer (Redis)")


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


def report_failure(exc: BaseException, *, open_s: float) -> None:
    """A layer operation failed: open the send breaker and tell every listener."""
    send_breaker.failed(exc, open_s=open_s)
    for listener in list(_listeners):
        try:
            listener.layer_failed()
        except Exception:
            logger.debug("layer failure listener raised", exc_info=True)


class RedisChannelLayer(_BaseRedisChannelLayer):
    """channels-redis with a bounded blocking connection pool per event loop."""

    def __init__(self, *args: Any, pool_size: int = 50, pool_timeout: float = 5.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool_size = pool_size
        self.pool_timeout = pool_timeout

    def create_pool(self, index: int) -> Any:
        """A blocking pool for host ``index`` (the host dict carries socket options)."""
        host = dict(self.hosts[index])
        address = host.pop("address")
        return aioredis.BlockingConnectionPool.from_url(
            address, max_connections=self.pool_size, timeout=self.pool_timeout, **host
        )

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
