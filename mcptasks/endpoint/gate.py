"""The HTTP gate of the endpoint: what a request must pass before any MCP is read.

Host and Origin (DNS rebinding, CORS), the declared body size, ``Accept``, the
``MCP-Protocol-Version`` header and bearer authentication, all read from the request's ASGI
scope. A refusal is an :class:`HttpError` (or the ``AuthError`` of :mod:`tenants.auth`) that the
consumer writes as it is.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.http.request import split_domain_port, validate_host

from mcptasks import conf, observability
from mcptasks.audit import watch
from mcptasks.protocol import jsonrpc, versions
from mcptasks.protocol.errors import INVALID_REQUEST, McpError, payload_too_large
from mcptasks.tasks.selectors import atoken_fingerprint
from tenants import auth_cache, auth_fingerprint, jwt_issuers
from tenants import conf as tenant_conf
from tenants.auth import AuthContext, AuthError, authenticate, cached_context_due, forget, remember
from tenants.conf import tenant_resource
from tenants.infra.coalesce import SingleFlight

#: The CORS headers answering an allowed cross-origin request (the origin itself is added).
_CORS_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"vary", b"Origin"),
    (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
    (
        b"access-control-allow-headers",
        # Mcp-Method, Mcp-Name: the 2026-07-28 routing headers (era2026).
        b"Content-Type, Authorization, Mcp-Session-Id, MCP-Protocol-Version, Last-Event-ID, Accept, "
        b"Mcp-Method, Mcp-Name",
    ),
    (b"access-control-expose-headers", b"Mcp-Session-Id, MCP-Protocol-Version, WWW-Authenticate"),
)

#: Verifications of one credential (by its cache key, a digest) under way in this process:
#: concurrent requests share them.
_verifications: SingleFlight[bytes, AuthContext] = SingleFlight()


class HttpError(Exception):
    """An HTTP-level refusal: status, optional JSON-RPC error body, extra headers."""

    def __init__(
        self, status: int, message: str, *, code: int = INVALID_REQUEST, headers: dict[str, str] | None = None,
        body: Any = None, rid: str | int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}
        self.body = body if body is not None else jsonrpc.error_response(rid, McpError(code, message))


def accepts(header: str, *types: str) -> bool:
    """Whether an ``Accept`` header lists every one of ``types`` (or ``*/*``)."""
    listed = {part.split(";")[0].strip().lower() for part in header.split(",")}
    return all(t in listed or "*/*" in listed for t in types)


def prefers_html(header: str) -> bool:
    """Whether an ``Accept`` header is a browser's: ``text/html`` ranks highest and no MCP stream type
    (``text/event-stream``) is listed at all (an MCP client's GET always lists it)."""
    ranked: list[tuple[float, str]] = []
    for part in header.split(",")[:32]:  # bounded: a hostile header costs nothing
        media, _, params = part.partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        ranked.append((q, media.strip().lower()))
    types = {media for _q, media in ranked}
    if "text/event-stream" in types or "text/html" not in types:
        return False
    best = max(q for q, _media in ranked)
    return best > 0 and any(media == "text/html" and q == best for q, media in ranked)


class Gate:
    """The HTTP rules of one request, read from its ASGI ``scope`` (headers decoded once)."""

    def __init__(self, scope: dict[str, Any]) -> None:
        self.scope = scope
        #: Sent with every response once the Origin was allowed (see :meth:`check_host_and_origin`).
        self.cors_headers: list[tuple[bytes, bytes]] = []
        self._host_checked = False
        self._parsed: dict[str, str] | None = None

    def headers(self) -> dict[str, str]:
        """The request's headers by lower-case name (the first of repeated ones), decoded once."""
        parsed = self._parsed
        if parsed is None:
            parsed = {}
            for k, v in self.scope.get("headers", []):
                parsed.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
            self._parsed = parsed
        return parsed

    def header(self, name: str) -> str:
        """The first value of header ``name`` (lower case), or ""."""
        return self.headers().get(name, "")

    def check_declared_size(self) -> None:
        """413 when ``Content-Length`` already says the body is over the limit (nothing read yet)."""
        declared, limit = self.header("content-length"), conf.get().MAX_BODY_BYTES
        if declared.isdigit() and int(declared) > limit:
            raise HttpError(413, payload_too_large(limit).message)

    def check_accept(self, *types: str) -> None:
        """406 unless ``Accept`` lists every one of ``types``."""
        if not accepts(self.header("accept"), *types):
            raise HttpError(406, f"Not Acceptable: Accept must list {' and '.join(types)}")

    def check_host_and_origin(self) -> None:
        """400 for a foreign Host, 403 for an Origin not allowed; an allowed Origin gets CORS headers."""
        if self._host_checked:
            return  # once per request (the preflight and handle() both ask)
        host = self.header("host")
        domain, _port = split_domain_port(host)
        if not host or not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
            # DNS rebinding: a foreign Host never reaches the application.
            raise HttpError(400, f"Invalid Host header: {host[:100]!r}")
        origin = self.header("origin")
        if origin:
            allowed = conf.get().ALLOWED_ORIGINS
            same_origin = origin.split("://", 1)[-1].rstrip("/") == host
            if not (same_origin or "*" in allowed or origin.rstrip("/") in allowed):
                raise HttpError(403, f"Origin not allowed: {origin[:100]}")
            self.cors_headers = [(b"access-control-allow-origin", origin.encode("latin-1")), *_CORS_HEADERS]
        self._host_checked = True

    def check_protocol_header(self, *, body_read: bool = False) -> None:
        """400 for an ``MCP-Protocol-Version`` no session-based revision has (see below)."""
        version = self.header("mcp-protocol-version")
        if version and not versions.is_supported(version):
            # era2026: a sessionless POST may be of the 2026-07-28 era, which answers this itself
            # (with the request id), so the check waits for the body (see the consumer's POST).
            if not body_read and self.scope.get("method") == "POST" and not self.header("mcp-session-id"):
                return
            raise HttpError(400, f"Unsupported MCP-Protocol-Version: {version[:40]}")

    def is_a_browser(self) -> bool:
        """Somebody opened the endpoint in a browser: it asks for HTML and carries nothing of MCP."""
        headers = self.headers()
        if any(h in headers for h in ("mcp-session-id", "authorization", "mcp-protocol-version", "last-event-id")):
            return False
        return prefers_html(headers.get("accept", ""))

    #: The headers of :meth:`landing_page`.
    LANDING_HEADERS: tuple[tuple[bytes, bytes], ...] = (
        (b"content-type", b"text/html; charset=utf-8"), (b"cache-control", b"no-store"), (b"vary", b"Accept"),
    )

    def landing_page(self) -> bytes:
        """A small HTML page saying what this URL is, instead of a JSON error nobody asked for."""
        from django.template.loader import render_to_string

        return render_to_string("mcptasks/landing.html", {
            "title": "mcptasks: the MCP endpoint", "mcp_url": self.resource_url(), "endpoint": True,
        }).encode()

    def tenant_slug(self) -> str | None:
        """The tenant of a tenant endpoint (``/mcp/t/<slug>``; the route validated it), else None."""
        slug = self.scope.get("url_route", {}).get("kwargs", {}).get("tenant")
        return str(slug) if slug else None

    def resource_url(self) -> str:
        """The protected resource this request addressed (what a token's audience must name)."""
        public = tenant_conf.get().PUBLIC_URL
        path = tenant_conf.get().MCP_PATH
        tenant = self.tenant_slug()
        if tenant:
            # A tenant's own endpoint (``/mcp/t/<slug>``): a resource of its own.
            path = tenant_resource(path, tenant)
        if public:
            return public.rstrip("/") + path
        scheme = "https" if self.scope.get("scheme") == "https" else "http"
        return f"{scheme}://{self.header('host')}{path}"

    async def authenticate(self) -> AuthContext:
        """The caller, or ``AuthError`` (401/403; a refused credential is audited)."""
        qs = self.scope.get("query_string", b"").decode("latin-1")
        headers, resource_url = self.headers(), self.resource_url()
        # A token verified in the last AUTH_CACHE_S costs no database hop (tenants.auth_cache).
        key, ctx, due = cached_context_due(headers=headers, query_string=qs, resource_url=resource_url)
        scheme, _, token = self.header("authorization").strip().partition(" ")
        bearer = token.strip() if scheme.lower() == "bearer" else ""

        previous = ctx
        # A built-in token's verdict, re-verified while still cached, is kept if nothing it was
        # decided from changed (tenants.auth_fingerprint): one indexed read on the event loop's
        # connection instead of an ORM verification on a thread. A first verification reads no
        # fingerprint: there is no verdict yet whose principal it would name.
        fingerprinted = previous is not None and key is not None and auth_fingerprint.is_builtin(bearer)

        async def verify() -> AuthContext:
            before = None
            if fingerprinted and previous is not None and key is not None:
                before = await atoken_fingerprint(token=bearer, principal_id=previous.principal_id)
                if before is not None and before == auth_cache.cache.fingerprint(key):
                    remember(key, previous, before)
                    return previous
            if bearer:
                # External JWTs: fetch signing keys here, off the shared database thread, so a
                # slow identity provider delays only its own tokens.
                await jwt_issuers.aprefetch(bearer)
            try:
                found: AuthContext = await database_sync_to_async(authenticate)(
                    headers=headers, query_string=qs, resource_url=resource_url)
            except AuthError:
                if key is not None:
                    forget(key)  # verified again in the background and refused: refused from now on
                raise
            after = None
            if before is not None:
                after = await atoken_fingerprint(token=bearer, principal_id=found.principal_id)
            remember(key, found, auth_fingerprint.reusable_after(before, after))
            return found

        if ctx is not None:
            if due and key is not None:
                # Verified again in the background before the verdict lapses; requests go on
                # with it meanwhile (it is still within AUTH_CACHE_S of its verification).
                _verifications.start(key, verify)
            if observability.logs.JSON_LOGS:
                observability.bind_log(tenant=ctx.tenant_slug)
            return ctx
        try:
            # Requests presenting the same credential while it is being verified share the
            # verification (when a cached verdict lapses, every request in flight misses at once).
            ctx = await (verify() if key is None else _verifications.run(key, verify))
        except AuthError as exc:
            if token:
                # A credential was presented and refused (a bare 401 is OAuth discovery).
                await watch.aauth_failed(
                    ip=watch.client_ip(self.scope), status=exc.status, reason=exc.message,
                    path=self.scope.get("path", ""), tenant_slug=self.tenant_slug(),
                )
            raise
        if observability.logs.JSON_LOGS:
            observability.bind_log(tenant=ctx.tenant_slug)
        return ctx
