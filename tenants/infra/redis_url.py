"""``REDIS_URL``: parsing, and refusal of what is not supported.

Every Redis client of the project (the channel layer of :mod:`mcptasks.streams.layers`, the counters
of :mod:`tenants.kv`) builds its pools from such a URL (:mod:`tenants.infra.redis_pools`), so each
supported deployment works everywhere:

* ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS), ``unix:///path?db=N``:
  one Redis server;
* ``redis+sentinel://[[user]:password@]host:port[,host:port…]/SERVICE[/DB]``: a primary found
  through Redis Sentinel. The pools ask the Sentinels for the primary of ``SERVICE`` whenever
  they connect, and a connection that meets a demoted primary (``READONLY``) is dropped, so a
  failover is followed by itself (:mod:`tenants.infra.redis_sentinel`). The password is the data
  nodes' (Sentinels without a password).

Redis Cluster is refused (``redis+cluster://``, or a cluster node behind a ``redis://`` URL, see
:func:`cluster_enabled`): cross-slot Lua scripts of the rate limiter and channels-redis's
keys do not work on it. Sentinel is the supported high-availability path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

import redis

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


def url_scheme(url: str) -> str:
    """``url``'s scheme, lower case (empty when it has none)."""
    scheme, sep, _ = url.partition("://")
    return scheme.lower() if sep else ""


def parse(url: str) -> RedisTarget:
    """Validate ``url``; raise :class:`RedisURLError` with a clear (credential-free) message."""
    scheme = url_scheme(url)
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
        return [("E011" if url_scheme(url) in CLUSTER_SCHEMES else "E010", str(exc))]
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
