"""Typed access to the ``MCPTASKS`` settings dict, with defaults for anything not set."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from django.conf import settings


@dataclass(frozen=True)
class AppSettings:
    """Every mcptasks setting, typed, with its default (see README, "Settings")."""

    MCP_PATH: str = "/mcp"
    PUBLIC_URL: str = ""
    ALLOWED_ORIGINS: tuple[str, ...] = ()
    MAX_BODY_BYTES: int = 4 * 1024 * 1024
    SESSION_IDLE_TIMEOUT_S: int = 24 * 3600
    SSE_RETRY_MS: int = 1000
    SSE_KEEPALIVE_S: float = 15.0
    SSE_MAX_STREAM_S: float = 300.0
    SSE_RETENTION_S: int = 600
    TOOLS_PAGE_SIZE: int = 50
    TASK_DEFAULT_TTL_MS: int = 3_600_000
    TASK_MAX_TTL_MS: int = 86_400_000
    TASK_POLL_INTERVAL_MS: int = 1000
    TASK_LIST_PAGE_SIZE: int = 50
    TASK_RESULT_RECHECK_S: float = 5.0
    REQUEST_RETENTION_S: int = 600
    CLEANUP_INTERVAL_S: float = 60.0
    CLEANUP_BATCH_SIZE: int = 500
    EMBEDDED_WORKER: bool = False
    WORKER_CONCURRENCY: int = 8
    WORKER_LEASE_S: float = 30.0
    WORKER_HEARTBEAT_S: float = 5.0
    WORKER_POLL_S: float = 2.0
    WORKER_SHUTDOWN_GRACE_S: float = 20.0
    TASK_MAX_ATTEMPTS: int = 3
    #: Largest tool result (JSON bytes) stored; a larger one fails its task with a clear message.
    RESULT_MAX_BYTES: int = 16 * 1024 * 1024
    #: Channel layer (Redis): socket read timeout. Must exceed the layer's 5 s blocking read.
    REDIS_SOCKET_TIMEOUT_S: float = 10.0
    #: Channel layer (Redis): connect timeout.
    REDIS_CONNECT_TIMEOUT_S: float = 2.0
    #: Channel layer (Redis): idle connections are pinged before use after this many seconds.
    REDIS_HEALTH_CHECK_S: float = 15.0
    #: Channel layer (Redis): connections per event loop (a blocking pool: callers wait).
    REDIS_LAYER_POOL_SIZE: int = 50
    #: Channel layer (Redis): longest wait for a free pooled connection.
    REDIS_LAYER_POOL_TIMEOUT_S: float = 5.0
    #: Longest wait for a wake-up or stream push through the layer; past it the send is
    #: dropped (receivers re-read the database) and sends pause for ``REDIS_BREAKER_S``.
    LAYER_SEND_TIMEOUT_S: float = 0.5
    #: After a layer failure, streams re-read the database and try to rejoin their groups
    #: this often until Redis answers again.
    LAYER_FALLBACK_POLL_S: float = 1.0
    #: Bearer token that ``GET /metrics`` requires; empty: ``/metrics`` answers loopback only.
    METRICS_TOKEN: str = ""
    ALLOW_ANONYMOUS: bool = False
    DEFAULT_TENANT: str = "default"


def get() -> AppSettings:
    """Current settings (read on each call so tests can override ``settings.MCPTASKS``)."""
    raw: dict[str, Any] = getattr(settings, "MCPTASKS", {})
    known = {f.name for f in fields(AppSettings)}
    values: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in known}
    return AppSettings(**values)
