"""The tenants settings (one typed definition each), and the resource URIs they imply."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tenants.infra.typed_settings import Loader, setting

#: Scopes an MCP client may hold (also the scopes of the anonymous principal).
MCP_SCOPES: tuple[str, ...] = ("mcp:tools", "mcp:tasks", "mcp:tasks:tenant")
#: Scopes advertised in WWW-Authenticate challenges when no particular scope is needed.
DEFAULT_CHALLENGE_SCOPES: tuple[str, ...] = ("mcp:tools", "mcp:tasks")
#: Scope of a token that reads the audit-review API (``/api/``) for an auditor or tenant admin.
AUDIT_READ_SCOPE = "audit:read"
#: Every scope an operator may grant an application or membership.
KNOWN_SCOPES: tuple[str, ...] = (*MCP_SCOPES, AUDIT_READ_SCOPE)


@dataclass(frozen=True)
class TenantSettings:
    """Every setting of the tenants app: type, default and meaning (the one definition).

    Read from ``MCPTASKS_<NAME>`` (see :mod:`tenants.infra.typed_settings`); ``docs/settings.md`` is
    generated from these fields.
    """

    MCP_PATH: str = setting("/mcp", "Path of the MCP endpoint (tenants' own endpoints are `<path>/t/<slug>`).")
    PUBLIC_URL: str = setting(
        "",
        "Public origin (e.g. `https://mcp.example.com`). The canonical resource URI (token audience) is "
        "`PUBLIC_URL + MCP_PATH`; unset, it is derived from the request. Set it in production.",
        shown="unset",
    )
    ALLOW_ANONYMOUS: bool = setting(
        False,
        "Admit requests without a token as the anonymous principal of the default tenant "
        "(check `tenants.W001` when DEBUG is off).",
    )
    DEFAULT_TENANT: str = setting("default", "Slug of the tenant of anonymous requests (created on demand).")
    TASK_DEFAULT_TTL_MS: int = setting(3_600_000, "ttl of a task created without one (per-tenant override).")
    TASK_MAX_TTL_MS: int = setting(
        86_400_000, "Requested ttls are clamped to this (per-tenant override). The actual ttl is returned."
    )
    TASK_MAX_CONCURRENT: int = setting(
        100,
        "Non-terminal tasks (task-augmented and plain calls) of a tenant whose own `max_concurrent_tasks` is empty: "
        "no tenant, new or existing, is unlimited by accident. A tenant's own limit wins. `0`: empty means unlimited.",
    )
    TASK_POLL_INTERVAL_MS: int = setting(1000, "`pollInterval` suggested to clients (per-tenant override).")
    BUILTIN_AS: bool = setting(
        True,
        "Serve the built-in authorization server (django-oauth-toolkit under `/o/`) and list it in the "
        "protected resource metadata. Off: only external issuers' JWTs are accepted.",
    )
    JWKS_CACHE_S: int = setting(3600, "External issuers' JWKS documents are cached this long (per process).")
    JWKS_MIN_REFRESH_S: int = setting(
        30, "A token with an unknown `kid` re-fetches its issuer's JWKS at most this often (per URL and process)."
    )
    JWKS_HTTP_TIMEOUT_S: float = setting(5.0, "Total deadline of one JWKS fetch (no redirects are followed).")
    JWKS_FAILURE_CACHE_S: float = setting(
        30.0, "A JWKS URL that failed is not tried again for this long: its tokens fail fast."
    )
    JWKS_ALLOW_HTTP: bool = setting(False, "Allow plain-http JWKS URLs on non-loopback hosts.")
    OUTBOUND_ALLOWED_NETWORKS: tuple[str, ...] = setting(
        (),
        "Comma-separated CIDRs the service's own outbound HTTP calls (JWKS fetches, later webhooks) may reach "
        "beyond global unicast addresses, e.g. `10.20.0.0/16`. Empty: loopback, private, link-local and "
        "metadata addresses are refused (checked on the resolved address at connect time).",
    )
    WEBHOOK_SECRET_OVERLAP_S: float = setting(
        24 * 3600.0,
        "After a webhook secret is rotated, deliveries carry signatures with the old and the new secret this long.",
    )
    LIMITS_CACHE_S: float = setting(
        1.0,
        "Each process re-reads a tenant's limits at least this often (admin edits apply without restart), "
        "in the background ahead of their lapse while requests come.",
        env="MCPTASKS_TENANT_LIMITS_CACHE_S",
    )
    FLAG_PENALTY_S: int = setting(
        0,
        "When above 0, a principal flagged for enumeration or fast polling (`flag.*` audit events) is held to "
        "`FLAG_PENALTY_RATE_PER_MIN` requests per minute per class for this many seconds. 0: flag only.",
        env="MCPTASKS_FLAG_PENALTY_S",
    )
    FLAG_PENALTY_RATE_PER_MIN: int = setting(
        30, "The per-principal rate while a penalty holds.", env="MCPTASKS_FLAG_PENALTY_RATE_PER_MIN"
    )
    AUTH_CACHE_S: float = setting(
        1.0,
        "A verified bearer token's auth context is reused for this long in each process (never past the "
        "token's expiry; edits in the same process clear it at once). Revocation, disabled tenants and "
        "narrowed grants reach every process within this time. `0` authenticates every request.",
    )
    AUTH_CACHE_MAX_ENTRIES: int = setting(
        10_000, "Verified tokens remembered per process (least recently used dropped)."
    )
    LOGIN_MAX_FAILURES_PER_IP: int = setting(
        50, "Failed sign-ins allowed per client address within `MCPTASKS_LOGIN_WINDOW_S`; then 429."
    )
    LOGIN_FREE_FAILURES: int = setting(
        3,
        "Failed sign-ins per username and client address before each further attempt from that address must wait "
        "(`MCPTASKS_LOGIN_DELAY_BASE_S`, doubling per failure). An account is never locked: its owner signs in "
        "from another address.",
    )
    LOGIN_DELAY_BASE_S: float = setting(1.0, "First wait after the free failures; it doubles with each further one.")
    LOGIN_DELAY_MAX_S: float = setting(300.0, "Longest wait between sign-in attempts of one username and address.")
    LOGIN_WINDOW_S: int = setting(
        900, "Window of the sign-in failure counters (a username and address without failures for this long starts "
        "afresh)."
    )
    TRUSTED_PROXIES: tuple[str, ...] = setting(
        (),
        "CIDRs of the reverse proxies in front of the server (comma-separated, e.g. `127.0.0.1/32,10.0.0.0/8`). "
        "Only when the direct peer is one of them is `X-Forwarded-For` read (rightmost hop that is not a trusted "
        "proxy) for the client address of the sign-in throttle, the audit and `/metrics`. Empty: the peer is the "
        "client. See [operations](operations.md#running-behind-a-tls-proxy).",
        shown="empty",
    )
    REDIS_OP_TIMEOUT_S: float = setting(
        0.25,
        "Budget of one Redis operation of the rate limiter (connect, wait for a pooled connection, read); "
        "past it the request goes on with the in-process fallback.",
    )
    REDIS_POOL_SIZE: int = setting(20, "Connections of the process-wide Redis client (rate limits, poll notes).")
    REDIS_BREAKER_S: float = setting(2.0, "After a Redis failure, skip Redis for this long before probing it again.")


_loader: Loader[TenantSettings] = Loader(TenantSettings, "TENANTS")
#: The current settings (cached; rebuilt when ``settings.TENANTS`` changes).
get = _loader.get
#: Forget the cached settings (after changing ``settings.TENANTS`` in place).
reset = _loader.reset
#: Keys of ``settings.TENANTS`` that name no setting.
unknown_keys = _loader.unknown_keys


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
    c = get()
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
    marker = get().MCP_PATH.rstrip("/") + f"/{TENANT_SEGMENT}/"
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
