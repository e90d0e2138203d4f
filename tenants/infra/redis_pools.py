"""The bounded *blocking* connection pools every Redis client of the project builds from a
``REDIS_URL`` (:mod:`tenants.infra.redis_url`): one server, or a primary found through Sentinel
(:mod:`tenants.infra.redis_sentinel`), for ``redis`` and for ``redis.asyncio``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from redis import asyncio as aioredis

from tenants.infra.redis_sentinel import (
    AsyncBlockingSentinelPool,
    AsyncEpochSentinel,
    BlockingSentinelPool,
    EpochSentinel,
)
from tenants.infra.redis_url import RedisTarget, parse, url_scheme


class _ReplicaDroppingConnection(redis.Connection):
    """A single-server connection that drops itself when the server answers ``READONLY``.

    The server behind a ``redis://`` name became a replica (a DNS-based failover, or a primary
    restarted as a replica): reconnecting resolves the name again, where keeping the connection
    meant ``ReadOnlyError`` forever. The caller sees a ``ConnectionError`` (an outage: it degrades).
    """

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """The reply; ``READONLY`` disconnects and raises ``ConnectionError``."""
        try:
            return super().read_response(*args, **kwargs)
        except redis.ReadOnlyError:
            self.disconnect()
            raise redis.ConnectionError("the Redis server is a read-only replica now; reconnecting") from None


class _ReplicaDroppingSSLConnection(_ReplicaDroppingConnection, redis.SSLConnection):
    """:class:`_ReplicaDroppingConnection` over TLS."""


class _AsyncReplicaDroppingConnection(aioredis.Connection):
    """:class:`_ReplicaDroppingConnection` for ``redis.asyncio``."""

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """The reply; ``READONLY`` disconnects and raises ``ConnectionError``."""
        try:
            return await super().read_response(*args, **kwargs)
        except redis.ReadOnlyError:
            await self.disconnect()
            raise redis.ConnectionError("the Redis server is a read-only replica now; reconnecting") from None


class _AsyncReplicaDroppingSSLConnection(_AsyncReplicaDroppingConnection, aioredis.SSLConnection):
    """:class:`_AsyncReplicaDroppingConnection` over TLS."""


def _sentinel_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """Connection options for the Sentinels themselves: the same short timeouts, no credentials."""
    return {k: options[k] for k in ("socket_timeout", "socket_connect_timeout", "socket_keepalive") if k in options}


def _credentials(target: RedisTarget) -> dict[str, Any]:
    """The data nodes' database and credentials from ``target`` (passed only when set)."""
    out: dict[str, Any] = {"db": target.db}
    if target.username:
        out["username"] = target.username
    if target.password:
        out["password"] = target.password
    return out


@dataclass(frozen=True)
class _Flavour:
    """The classes of one client library (``redis`` or ``redis.asyncio``) that a pool is made of."""

    single_server_pool: Any
    connection: Any
    ssl_connection: Any
    sentinel: Any
    sentinel_pool: Any


_SYNC = _Flavour(redis.BlockingConnectionPool, _ReplicaDroppingConnection, _ReplicaDroppingSSLConnection,
                 EpochSentinel, BlockingSentinelPool)
_ASYNC = _Flavour(aioredis.BlockingConnectionPool, _AsyncReplicaDroppingConnection,
                  _AsyncReplicaDroppingSSLConnection, AsyncEpochSentinel, AsyncBlockingSentinelPool)


def _single_server_class(url: str, flavour: _Flavour) -> dict[str, Any]:
    """``connection_class`` for a single-server URL (unix sockets keep redis-py's own)."""
    scheme = url_scheme(url)
    if scheme == "redis":
        return {"connection_class": flavour.connection}
    if scheme == "rediss":
        return {"connection_class": flavour.ssl_connection}
    return {}


def _pool(url: str, flavour: _Flavour, *, max_connections: int, timeout: float, **options: Any) -> Any:
    """A bounded blocking pool of ``flavour`` for ``url`` (a caller waits up to ``timeout``)."""
    target = parse(url)
    if not target.is_sentinel:
        return flavour.single_server_pool.from_url(url, max_connections=max_connections, timeout=timeout,
                                                   **_single_server_class(url, flavour), **options)
    sentinel = flavour.sentinel(list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(options))
    return flavour.sentinel_pool(target.service, sentinel, max_connections=max_connections, timeout=timeout,
                                 **_credentials(target), **options)


def sync_pool(url: str, *, max_connections: int, timeout: float, **options: Any) -> Any:
    """A bounded *blocking* ``redis`` connection pool for ``url`` (a caller waits up to ``timeout``)."""
    return _pool(url, _SYNC, max_connections=max_connections, timeout=timeout, **options)


def async_pool(url: str, *, max_connections: int, timeout: float, **options: Any) -> Any:
    """:func:`sync_pool` for ``redis.asyncio`` (one per event loop: connections belong to their loop)."""
    return _pool(url, _ASYNC, max_connections=max_connections, timeout=timeout, **options)
