"""``REDIS_URL``: parsing, refusal of what is not supported, and the connection pools built from it.

Every Redis client of the project (the channel layer of :mod:`mcptasks.layers`, the counters
of :mod:`tenants.kv`) builds its pools here, so each supported deployment works everywhere:

* ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS), ``unix:///path?db=N``:
  one Redis server;
* ``redis+sentinel://[[user]:password@]host:port[,host:port…]/SERVICE[/DB]``: a primary found
  through Redis Sentinel. The pools ask the Sentinels for the primary of ``SERVICE`` whenever
  they connect, and a connection that meets a demoted primary (``READONLY``) is dropped, so a
  failover is followed by itself. The password is the data nodes' (Sentinels without a password).

Redis Cluster is refused (``redis+cluster://``, or a cluster node behind a ``redis://`` URL, see
:func:`cluster_enabled`): cross-slot Lua scripts of the rate limiter and channels-redis's
keys do not work on it. Sentinel is the supported high-availability path.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis
from redis import asyncio as aioredis
from redis import sentinel as ssentinel
from redis.asyncio import sentinel as asentinel

logger = logging.getLogger(__name__)

PLAIN_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
_SERVICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]{0,252})$")
#: Most Sentinels accepted in one URL (each one is asked in turn on every (re)connect).
MAX_SENTINELS = 16


class RedisURLError(ValueError):
    """``REDIS_URL`` is malformed or names an unsupported deployment (message safe to show)."""


@dataclass(frozen=True)
class RedisTarget:
    """What a ``REDIS_URL`` names. ``sentinels`` is empty for a single server (``url`` then)."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None

    @property
    def is_sentinel(self) -> bool:
        """Whether the primary is found through Sentinels."""
        return bool(self.sentinels)

    def describe(self) -> str:
        """The target without any credential (for logs and messages)."""
        if self.is_sentinel:
            hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
            return f"{SENTINEL_SCHEME}://{hosts}/{self.service}/{self.db}"
        return redact(self.url)


def redact(url: str) -> str:
    """``url`` with the user-info part (credentials) replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "<not a URL>"
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{scheme}://{netloc}{slash}{path}"


def _scheme(url: str) -> str:
    scheme, sep, _ = url.partition("://")
    return scheme.lower() if sep else ""


def parse(url: str) -> RedisTarget:
    """Validate ``url``; raise :class:`RedisURLError` with a clear (credential-free) message."""
    scheme = _scheme(url)
    if scheme in CLUSTER_SCHEMES:
        raise RedisURLError(
            "Redis Cluster is not supported (the rate limiter's multi-key scripts and the channel "
            "layer need one keyspace); use a primary with replicas behind Redis Sentinel: "
            "REDIS_URL=redis+sentinel://host:port[,host:port…]/SERVICE[/DB]."
        )
    if scheme == SENTINEL_SCHEME:
        return _parse_sentinel(url)
    if scheme not in PLAIN_SCHEMES:
        raise RedisURLError(
            f"REDIS_URL scheme {scheme or '(none)'!r} is not supported; use redis://, rediss://, unix:// "
            "or redis+sentinel://."
        )
    try:
        redis.connection.parse_url(url)
    except (ValueError, TypeError) as exc:
        raise RedisURLError(f"REDIS_URL {redact(url)} is malformed: {exc}") from None
    return RedisTarget(url=url)


def _parse_sentinel(url: str) -> RedisTarget:
    shown = redact(url)
    rest = url.partition("://")[2]
    if "?" in rest or "#" in rest:
        raise RedisURLError(f"REDIS_URL {shown}: a redis+sentinel:// URL takes no query or fragment.")
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        user, has_password, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if has_password else None
        if not has_password:  # redis:// convention: a lone user-info part is the password
            username, password = None, unquote(user) or None
    hosts: list[tuple[str, int]] = []
    for item in netloc.split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon or not host or not _HOST.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise RedisURLError(
                f"REDIS_URL {shown}: each Sentinel must be host:port (got {item.strip()[:64]!r})."
            )
        hosts.append((host.strip("[]"), int(port)))
    if len(hosts) > MAX_SENTINELS:
        raise RedisURLError(f"REDIS_URL {shown}: at most {MAX_SENTINELS} Sentinels.")
    parts = path.split("/") if path else []
    if parts and parts[-1] == "":
        parts.pop()
    if not parts or not _SERVICE.match(parts[0]):
        raise RedisURLError(
            f"REDIS_URL {shown}: name the Sentinel service (master name) as the path: "
            "redis+sentinel://host:port[,host:port…]/SERVICE[/DB]."
        )
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit() or int(parts[1]) > 65535:
            raise RedisURLError(f"REDIS_URL {shown}: the database must be a number (got {parts[1][:16]!r}).")
        db = int(parts[1])
    elif len(parts) > 2:
        raise RedisURLError(f"REDIS_URL {shown}: expected /SERVICE[/DB] after the Sentinels.")
    return RedisTarget(url=url, sentinels=tuple(hosts), service=parts[0], db=db, username=username,
                       password=password)


def _sentinel_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """Connection options for the Sentinels themselves: the same short timeouts, no credentials."""
    return {k: options[k] for k in ("socket_timeout", "socket_connect_timeout", "socket_keepalive") if k in options}


def _credentials(target: RedisTarget) -> dict[str, Any]:
    out: dict[str, Any] = {"db": target.db}
    if target.username:
        out["username"] = target.username
    if target.password:
        out["password"] = target.password
    return out


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


def _single_server_class(url: str, *, asynchronous: bool) -> dict[str, Any]:
    """``connection_class`` for a single-server URL (unix sockets keep redis-py's own)."""
    scheme = _scheme(url)
    if scheme == "redis":
        return {"connection_class": _AsyncReplicaDroppingConnection if asynchronous else _ReplicaDroppingConnection}
    if scheme == "rediss":
        return {"connection_class": _AsyncReplicaDroppingSSLConnection if asynchronous
                else _ReplicaDroppingSSLConnection}
    return {}


def _newest_primary(states: list[dict[str, Any]]) -> tuple[str, int] | None:
    """The primary named by the newest configuration among the Sentinels' answers.

    Sentinels learn of a failover one after another (the leader first, the others from its hello
    messages a second or two later). A Sentinel that has not heard yet still names the old
    primary, and a killed primary that was just restarted answers as a primary until the
    Sentinels turn it into a replica: taking the first Sentinel's word (redis-py's rule) sent a
    process's writes and blocking reads to that node, where they were lost. Each answer carries
    the configuration epoch it comes from; the highest epoch is the Sentinels' current truth
    (ties: the address most of them name).
    """
    best: dict[tuple[str, int], tuple[int, int]] = {}
    for state in states:
        address = (str(state["ip"]), int(state["port"]))
        epoch = int(state.get("config-epoch", 0) or 0)
        seen_epoch, votes = best.get(address, (-1, 0))
        best[address] = (max(seen_epoch, epoch), votes + 1)
    if not best:
        return None
    return max(best.items(), key=lambda item: item[1])[0]


class EpochSentinel(ssentinel.Sentinel):
    """redis-py's Sentinel manager, asking every Sentinel and trusting the newest epoch."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        """The primary's address by :func:`_newest_primary` (MasterNotFoundError when none)."""
        states: list[dict[str, Any]] = []
        for sentinel in self.sentinels:
            try:
                masters: Any = sentinel.sentinel_masters()
                state = masters.get(service_name)
            except (redis.ConnectionError, redis.TimeoutError):
                continue
            if state and self.check_master_state(state, service_name):
                states.append(state)
        found = _newest_primary(states)
        if found is None:
            raise ssentinel.MasterNotFoundError(f"No master found for {service_name!r}")
        return found


class AsyncEpochSentinel(asentinel.Sentinel):
    """:class:`EpochSentinel` for ``redis.asyncio`` (the Sentinels are asked at once)."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        """The primary's address by :func:`_newest_primary` (MasterNotFoundError when none)."""

        async def ask(sentinel: Any) -> dict[str, Any] | None:
            try:
                state: dict[str, Any] | None = (await sentinel.sentinel_masters()).get(service_name)
            except (redis.ConnectionError, redis.TimeoutError):
                return None
            return state if state and self.check_master_state(state, service_name) else None

        answers = await asyncio.gather(*(ask(s) for s in self.sentinels))
        found = _newest_primary([a for a in answers if a is not None])
        if found is None:
            raise asentinel.MasterNotFoundError(f"No master found for {service_name!r}")
        return found


class BlockingSentinelPool(ssentinel.SentinelConnectionPool, redis.BlockingConnectionPool):
    """Sentinel-managed connections (primary re-resolved on connect, dropped on READONLY), bounded and
    blocking like the single-server pools (redis-py's own Sentinel pool refuses the call past its size)."""


class AsyncBlockingSentinelPool(asentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """:class:`BlockingSentinelPool` for ``redis.asyncio``, which also drops connections held *in use*
    on the old primary once the Sentinels name a new one.

    redis-py re-resolves the primary only when a connection (re)connects. A connection blocked in a
    read (the channel layer's BZPOPMIN) stays on the demoted primary until that server closes it:
    the process's receives, hence every live stream and ``/readyz``, stalled for 10 s and more
    after a failover. Every :attr:`watch_s` while any connection is in use, a background check
    asks the Sentinels (:meth:`get_master_address`); when the primary moved, every connection of
    the pool is disconnected, so blocked reads fail at once and reconnect to the new primary.
    """

    #: Longest time between two checks of the primary's address while the pool is in use.
    watch_s = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._checked_at = 0.0
        self._watch: asyncio.Future[None] | None = None

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        """A connection, with the primary watched while any connection of the pool is in use."""
        if self._watch is None or self._watch.done():
            # The reference keeps the task alive; _watch_primary never raises (nothing to retrieve).
            self._watch = asyncio.ensure_future(self._watch_primary())
        return await super().get_connection(*args, **kwargs)

    async def _watch_primary(self) -> None:
        """Check the primary every :attr:`watch_s` for as long as connections are in use.

        Checked on a timer, not only when a connection is taken: a process whose one use of the
        pool is a blocking read (an idle worker waiting for a wake-up) takes no other connection,
        and its read stayed on the demoted primary until the read's own timeout, while every
        wake-up went to the new one (found by the Sentinel failover test: a worker deaf for 9 s).
        """
        while True:
            now = time.monotonic()
            if now - self._checked_at >= self.watch_s:
                self._checked_at = now
                await self._check_primary()
            await asyncio.sleep(self.watch_s)
            if not getattr(self, "_in_use_connections", None):
                return

    async def _check_primary(self) -> None:
        if self.master_address is None:
            return  # nothing connected yet: the next connect asks the Sentinels anyway
        try:
            await self.get_master_address()
        except Exception:
            return  # Sentinels unreachable or no primary: connections fail (and recover) on their own

    async def get_master_address(self) -> Any:
        """The primary's address; when it moved, every connection of the pool is dropped.

        redis-py drops only the idle ones here. A connection in use (a blocking read) then stayed on
        the demoted primary, and since the address was already updated, the watch found nothing
        to do: whichever noticed the move first, a new connection or the watch, decided whether a
        worker heard its wake-ups within a second or after its read's own timeout.
        """
        address = await self.sentinel_manager.discover_master(self.service_name)
        known = self.master_address
        if self.is_master and known != address:
            self.master_address = address
            if known is not None:
                logger.warning("Redis primary of %r moved from %s:%s to %s:%s; reconnecting", self.service_name,
                               known[0], known[1], address[0], address[1])
                try:
                    await self.disconnect(inuse_connections=True)
                except Exception:
                    logger.debug("disconnecting from the old primary failed", exc_info=True)
        return address


def sync_pool(url: str, *, max_connections: int, timeout: float, **options: Any) -> Any:
    """A bounded *blocking* ``redis`` connection pool for ``url`` (a caller waits up to ``timeout``)."""
    target = parse(url)
    if not target.is_sentinel:
        return redis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=timeout,
                                                     **_single_server_class(url, asynchronous=False), **options)
    sentinel = EpochSentinel(list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(options))
    return BlockingSentinelPool(target.service, sentinel, max_connections=max_connections, timeout=timeout,
                                **_credentials(target), **options)


def async_pool(url: str, *, max_connections: int, timeout: float, **options: Any) -> Any:
    """:func:`sync_pool` for ``redis.asyncio`` (one per event loop: connections belong to their loop)."""
    target = parse(url)
    if not target.is_sentinel:
        return aioredis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=timeout,
                                                        **_single_server_class(url, asynchronous=True), **options)
    sentinel = AsyncEpochSentinel(list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(options))
    return AsyncBlockingSentinelPool(target.service, sentinel, max_connections=max_connections, timeout=timeout,
                                **_credentials(target), **options)


def cluster_enabled(url: str, *, timeout_s: float = 1.0) -> bool | None:
    """Whether the server behind ``url`` is a Redis Cluster node (None: could not ask).

    One ``INFO cluster`` on a short-lived connection: cheap enough for ``manage.py check`` and
    process start, never on a request path.
    """
    target = parse(url)
    if target.is_sentinel:
        return False  # Sentinel-managed deployments are never clustered
    try:
        with redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                  retry_on_timeout=False) as c:
            return bool(int(c.info("cluster").get("cluster_enabled", 0)))
    except (redis.RedisError, OSError, ValueError):
        return None


def problems(url: str, *, probe: bool = True) -> list[tuple[str, str]]:
    """``(id suffix, message)`` of what makes ``url`` unusable: ``E010`` refused URL, ``E011`` a cluster node.

    ``probe`` asks the server (``INFO cluster``, see :func:`cluster_enabled`); an unreachable
    server is not a problem here (Redis is an accelerator: processes start and degrade).
    """
    if not url:
        return []
    try:
        parse(url)
    except RedisURLError as exc:
        return [("E011" if _scheme(url) in CLUSTER_SCHEMES else "E010", str(exc))]
    if probe and cluster_enabled(url):
        return [("E011", f"REDIS_URL {redact(url)} points at a Redis Cluster node (cluster_enabled:1); Redis "
                         "Cluster is not supported. Use a primary with replicas behind Redis Sentinel "
                         "(redis+sentinel://host:port[,host:port…]/SERVICE[/DB]).")]
    return []


def require_supported(url: str, role: str) -> None:
    """Refuse to start a serving process (web, worker) on an unsupported or malformed ``REDIS_URL``."""
    from django.core.exceptions import ImproperlyConfigured

    found = problems(url)
    if found:
        raise ImproperlyConfigured(f"The {role} refuses to start: {found[0][1]}")
