"""Typed access to the ``TENANTS`` settings dict, with defaults for anything not set."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from django.conf import settings

from mcptasks import conf as mcp_conf

#: Scopes an MCP client may hold (also the scopes of the anonymous principal).
MCP_SCOPES: tuple[str, ...] = ("mcp:tools", "mcp:tasks", "mcp:tasks:tenant")
#: Scopes advertised in WWW-Authenticate challenges when no particular scope is needed.
DEFAULT_CHALLENGE_SCOPES: tuple[str, ...] = ("mcp:tools", "mcp:tasks")


@dataclass(frozen=True)
class TenantSettings:
    """Every tenants setting, typed, with its default."""

    BUILTIN_AS: bool = True
    JWKS_CACHE_S: int = 3600
    JWKS_MIN_REFRESH_S: int = 30
    JWKS_HTTP_TIMEOUT_S: float = 5.0
    #: A JWKS URL that failed is not tried again for this long (its tokens fail fast).
    JWKS_FAILURE_CACHE_S: float = 30.0
    JWKS_ALLOW_HTTP: bool = False
    LIMITS_CACHE_S: float = 2.0
    #: Sign-in: failed attempts allowed per client address, and per username, in the window.
    LOGIN_MAX_FAILURES_PER_IP: int = 50
    LOGIN_MAX_FAILURES_PER_USER: int = 10
    LOGIN_WINDOW_S: int = 900
    #: Budget of one Redis operation of the rate limiter (connect, wait for a pooled
    #: connection, read); past it the request goes on with the in-process fallback.
    REDIS_OP_TIMEOUT_S: float = 0.25
    #: Connections of the process-wide Redis client (rate limits, poll notes).
    REDIS_POOL_SIZE: int = 20
    #: After a Redis failure, skip Redis for this long before probing it again.
    REDIS_BREAKER_S: float = 2.0


def get() -> TenantSettings:
    """Current settings (read on each call so tests can override ``settings.TENANTS``)."""
    raw: dict[str, Any] = getattr(settings, "TENANTS", {})
    known = {f.name for f in fields(TenantSettings)}
    return TenantSettings(**{k: v for k, v in raw.items() if k in known})


#: Path segment between the MCP path and a tenant's slug in a tenant's own endpoint URL
#: (``/mcp/t/<slug>``).
TENANT_SEGMENT = "t"
_SLUG = re.compile(r"[-a-zA-Z0-9_]{1,64}")


def canonical_resource(resource_url: str) -> str:
    """This server's canonical resource URI for ``resource_url`` (RFC 8707 audience).

    ``PUBLIC_URL + MCP_PATH`` when ``MCPTASKS_PUBLIC_URL`` is set, else ``resource_url`` (the
    URL of the MCP endpoint as derived from the request), normalised: lower-case scheme and
    host, no default port, no query, fragment or trailing slash. A tenant's own endpoint
    (``…/mcp/t/<slug>``) keeps its tenant suffix: it is a resource of its own.
    """
    c = mcp_conf.get()
    if not c.PUBLIC_URL:
        return normalize_uri(resource_url)
    base = normalize_uri(c.PUBLIC_URL.rstrip("/") + c.MCP_PATH)
    slug = resource_tenant(resource_url)
    return tenant_resource(base, slug) if slug else base


def shared_resource(resource_url: str) -> str:
    """The canonical URI of the shared endpoint (``…/mcp``), whichever endpoint was reached."""
    here = canonical_resource(resource_url)
    slug = resource_tenant(here)
    return here[: -len(f"/{TENANT_SEGMENT}/{slug}")] if slug else here


def tenant_resource(shared: str, slug: str) -> str:
    """A tenant's own resource URI: ``<shared endpoint>/t/<slug>``.

    The default audience of tokens from the tenant's external issuers: an identity provider
    trusted by several tenants issues tokens that name one tenant's endpoint, so a token for
    tenant B is never accepted by tenant A.
    """
    return f"{shared.rstrip('/')}/{TENANT_SEGMENT}/{slug}"


def resource_tenant(resource_url: str) -> str | None:
    """The tenant slug of a tenant endpoint URL (``…<MCP_PATH>/t/<slug>``), else None."""
    from urllib.parse import urlsplit

    path = urlsplit(resource_url).path.rstrip("/")
    marker = mcp_conf.get().MCP_PATH.rstrip("/") + f"/{TENANT_SEGMENT}/"
    head, found, slug = path.rpartition(marker)
    # The MCP path may sit under PUBLIC_URL's own path prefix, so only the tail is fixed.
    if not found or (head and not head.startswith("/")):
        return None
    return slug if _SLUG.fullmatch(slug) else None


def normalize_uri(uri: str) -> str:
    """Normalise an absolute http(s) URI for comparison (RFC 3986 §6.2.2-6.2.3)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None and not ((scheme == "http" and port == 80) or (scheme == "https" and port == 443)):
        host = f"{host}:{port}"
    path = parts.path.rstrip("/")
    return urlunsplit((scheme, host, path, "", ""))


_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def same_resource(a: str, b: str) -> bool:
    """Whether two normalised resource URIs name this server's same endpoint.

    Equal URIs do; so do URIs that differ only in the loopback name (``localhost``,
    ``127.0.0.1``, ``[::1]``): on one machine they are the same endpoint, so a development token
    bound to ``http://127.0.0.1:8000/mcp`` also works at ``http://localhost:8000/mcp``.
    """
    if a == b:
        return True
    from urllib.parse import urlsplit

    pa, pb = urlsplit(a), urlsplit(b)
    loopback = {pa.hostname and _bracket(pa.hostname), pb.hostname and _bracket(pb.hostname)} <= set(_LOOPBACK_NAMES)
    return bool(loopback and pa.scheme == pb.scheme and pa.port == pb.port and pa.path == pb.path)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def public_origin(resource_url: str) -> str:
    """``scheme://host[:port]`` of the canonical resource: the issuer of the built-in AS."""
    from urllib.parse import urlsplit

    p = urlsplit(canonical_resource(resource_url))
    return f"{p.scheme}://{p.netloc}"
