"""Verification of JWT access tokens from external issuers (Auth0, Keycloak, Entra, ...).

Each :class:`~tenants.models.ExternalIssuer` row names an issuer a tenant trusts, where its
keys are (JWKS URL, static JWKS, or an explicit shared secret for HS*), the audience it must
use (by default this server's canonical resource URI, RFC 8707) and which claims name the
tenant, the principal and the scopes. JWKS documents are cached in the Django cache and
re-fetched (at most every ``JWKS_MIN_REFRESH_S``) when a token names an unknown ``kid``.
Tokens are never logged.

Fetching never happens on a request's thread: the web process calls :func:`aprefetch` first,
which fetches missing documents on a small executor of its own, one fetch per URL at a time
(single flight: other requests await the same future, holding no thread), within a total
deadline, without following redirects; failures are remembered for ``JWKS_FAILURE_CACHE_S``.
A slow or dead identity provider therefore delays only the requests that need it.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import jwt
from django.core.cache import cache

from tenants import conf, outbound
from tenants.conf import canonical_resource, resource_tenant, same_resource, shared_resource, tenant_resource
from tenants.context import AuthContext
from tenants.models import LEEWAY_S_LIMIT, ExternalIssuer, Principal

logger = logging.getLogger(__name__)

_MAX_JWKS_BYTES = 512 * 1024


class JwtRejected(Exception):
    """A JWT was refused. ``reason`` is for logs, ``public_message`` for the client."""

    def __init__(self, reason: str, public_message: str = "Invalid access token") -> None:
        super().__init__(reason)
        self.reason = reason
        self.public_message = public_message


class JwksUnavailable(Exception):
    """The JWKS document could not be fetched or parsed."""


def _is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def fetch_jwks(url: str) -> dict[str, Any]:
    """GET a JWKS document (https; plain http only for loopback or with ``JWKS_ALLOW_HTTP``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http"):
        raise JwksUnavailable(f"unsupported JWKS URL scheme {parts.scheme!r}")
    if parts.scheme == "http" and not (conf.get().JWKS_ALLOW_HTTP or _is_loopback(parts.hostname or "")):
        raise JwksUnavailable("plain-http JWKS URL refused (set MCPTASKS_JWKS_ALLOW_HTTP=1 to allow)")
    request = urllib.request.Request(url, headers={"Accept": "application/json"})  # noqa: S310
    deadline = time.monotonic() + conf.get().JWKS_HTTP_TIMEOUT_S
    try:
        with _OPENER.open(request, timeout=conf.get().JWKS_HTTP_TIMEOUT_S) as resp:
            raw = b""
            while len(raw) <= _MAX_JWKS_BYTES:
                if time.monotonic() > deadline:
                    raise JwksUnavailable("JWKS fetch exceeded its deadline")
                chunk = resp.read(65536)
                if not chunk:
                    break
                raw += chunk
    except OSError as exc:
        raise JwksUnavailable(f"JWKS fetch failed: {exc}") from exc
    if len(raw) > _MAX_JWKS_BYTES:
        raise JwksUnavailable("JWKS document too large")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise JwksUnavailable("JWKS is not JSON") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise JwksUnavailable("JWKS has no 'keys' list")
    return doc


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        raise JwksUnavailable("JWKS URL redirects; redirects are not followed")


#: Every connection goes through the outbound-address policy (tenants.outbound).
_OPENER = outbound.build_opener(_NoRedirects)


def _cache_key(url: str, kind: str) -> str:
    return f"tenants:jwks:{kind}:{hashlib.sha256(url.encode()).hexdigest()[:32]}"


def get_jwks(url: str, *, refresh: bool = False) -> dict[str, Any]:
    """The JWKS at ``url``, from the cache unless ``refresh`` (which is rate limited per URL)."""
    settings = conf.get()
    key = _cache_key(url, "doc")
    doc: dict[str, Any] | None = cache.get(key)
    failed = cache.get(_cache_key(url, "failed"))
    if doc is None and failed is not None:
        raise JwksUnavailable(f"JWKS fetch failed recently: {failed}")
    if doc is not None and refresh:
        # One forced re-fetch per JWKS_MIN_REFRESH_S across all processes sharing the cache.
        if not cache.add(_cache_key(url, "refresh"), 1, timeout=settings.JWKS_MIN_REFRESH_S):
            return doc
        doc = None
    if doc is None:
        doc = _fetch_and_remember(url)
    return doc


def _fetch_and_remember(url: str) -> dict[str, Any]:
    settings = conf.get()
    try:
        doc = fetch_jwks(url)
    except JwksUnavailable as exc:
        cache.set(_cache_key(url, "failed"), str(exc)[:200], timeout=settings.JWKS_FAILURE_CACHE_S)
        raise
    cache.set(_cache_key(url, "doc"), doc, timeout=settings.JWKS_CACHE_S)
    cache.delete(_cache_key(url, "failed"))
    cache.add(_cache_key(url, "refresh"), 1, timeout=settings.JWKS_MIN_REFRESH_S)
    return doc


#: JWKS fetches run here, never on a request's thread or the shared database thread.
_EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="jwks")
#: One fetch per URL at a time (per event loop): later requests await the same future.
_in_flight: dict[tuple[int, str], asyncio.Future[Any]] = {}
_issuer_urls: dict[str, tuple[float, list[str]]] = {}


def _jwks_urls(iss: str) -> list[str]:
    hit = _issuer_urls.get(iss)
    now = time.monotonic()
    if hit is not None and hit[0] > now:
        return hit[1]
    urls = sorted(
        {u for u in ExternalIssuer.objects.filter(issuer=iss, active=True).values_list("jwks_url", flat=True) if u}
    )
    if len(_issuer_urls) > 1000:
        _issuer_urls.clear()
    _issuer_urls[iss] = (now + 5.0, urls)
    return urls


def _needs_fetch(url: str, kid: str | None) -> bool:
    if cache.get(_cache_key(url, "failed")) is not None:
        return False  # negative cache: fail fast until it expires
    doc = cache.get(_cache_key(url, "doc"))
    if doc is None:
        return True
    if kid is None or any(isinstance(k, dict) and k.get("kid") == kid for k in doc.get("keys", [])):
        return False
    # An unknown kid: one re-fetch per JWKS_MIN_REFRESH_S.
    if cache.add(_cache_key(url, "refresh"), 1, timeout=conf.get().JWKS_MIN_REFRESH_S):
        cache.delete(_cache_key(url, "doc"))
        return True
    return False


async def aprefetch(token: str) -> None:
    """Make sure the JWKS documents ``token`` needs are cached (or known to be failing).

    Call before :func:`tenants.auth.authenticate` in async code. Never raises: verification
    reports what went wrong.
    """
    if token.count(".") != 2:
        return
    try:
        header = jwt.get_unverified_header(token)
        iss = jwt.decode(token, options={"verify_signature": False}).get("iss")
    except jwt.PyJWTError:
        return
    if not isinstance(iss, str) or len(iss) > 500:
        return
    from asgiref.sync import sync_to_async

    kid = header.get("kid")
    kid = str(kid) if kid is not None else None
    urls = await sync_to_async(_jwks_urls, thread_sensitive=False)(iss)
    loop = asyncio.get_running_loop()
    deadline = conf.get().JWKS_HTTP_TIMEOUT_S
    for url in urls:
        if not _needs_fetch(url, kid):
            continue
        key = (id(loop), url)
        future = _in_flight.get(key)
        if future is None:
            future = asyncio.ensure_future(asyncio.wait_for(
                loop.run_in_executor(_EXECUTOR, _fetch_and_remember, url), timeout=deadline
            ))
            _in_flight[key] = future

            def forget(_f: asyncio.Future[Any], k: tuple[int, str] = key) -> None:
                _in_flight.pop(k, None)

            future.add_done_callback(forget)
        try:
            await asyncio.shield(future)
        except (JwksUnavailable, TimeoutError):
            if cache.get(_cache_key(url, "failed")) is None:
                cache.set(_cache_key(url, "failed"), "timed out", timeout=conf.get().JWKS_FAILURE_CACHE_S)
        except Exception:
            logger.warning("JWKS prefetch of an issuer failed", exc_info=True)


def _pick_key(doc: dict[str, Any], *, kid: str | None, alg: str) -> Any | None:
    candidates = []
    for jwk in doc.get("keys", []):
        if not isinstance(jwk, dict):
            continue
        if jwk.get("use") not in (None, "sig"):
            continue
        if kid is not None and jwk.get("kid") != kid:
            continue
        if jwk.get("alg") not in (None, alg):
            continue
        candidates.append(jwk)
    if kid is None and len(candidates) != 1:
        return None
    for jwk in candidates:
        try:
            return jwt.PyJWK(jwk, algorithm=alg).key
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
            continue
    return None


def _resolve_key(issuer: ExternalIssuer, *, kid: str | None, alg: str) -> Any:
    if alg.upper().startswith("HS"):
        return issuer.shared_secret
    if issuer.static_keys:
        key = _pick_key(issuer.static_keys, kid=kid, alg=alg)
        if key is not None:
            return key
    if issuer.jwks_url:
        try:
            key = _pick_key(get_jwks(issuer.jwks_url), kid=kid, alg=alg)
            if key is None:
                key = _pick_key(get_jwks(issuer.jwks_url, refresh=True), kid=kid, alg=alg)
        except JwksUnavailable as exc:
            logger.warning("issuer %s: %s", issuer.pk, exc)
            # The same public answer as an unknown key: the caller must not learn whether
            # (or how) the JWKS URL answered.
            raise JwtRejected(f"JWKS unavailable: {exc}", _NO_KEY) from None
        if key is not None:
            return key
    raise JwtRejected(f"no key for kid={kid!r} alg={alg}", _NO_KEY)


#: The one public answer when no key verifies a token, whatever the JWKS URL did.
_NO_KEY = "Token signed with an unknown key"


def _scopes(issuer: ExternalIssuer, claims: dict[str, Any]) -> frozenset[str]:
    value = claims.get(issuer.scopes_claim)
    if value is None and issuer.scopes_claim == ExternalIssuer.ScopesClaim.SCOPE:
        value = claims.get("scp")
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list):
        return frozenset(str(v) for v in value)
    return frozenset()


def _verify_with(
    issuer: ExternalIssuer, *, token: str, header: dict[str, Any], resource_url: str
) -> dict[str, Any]:
    alg = str(header.get("alg", ""))
    if alg not in issuer.allowed_algorithms():
        raise JwtRejected(f"algorithm {alg!r} not allowed", "Token algorithm not allowed")
    kid = header.get("kid")
    key = _resolve_key(issuer, kid=str(kid) if kid is not None else None, alg=alg)
    # Blank audience: the tenant's own endpoint, so one identity provider trusted by several
    # tenants can never have a token for one accepted by another.
    # An explicit audience is the operator's choice and holds at every endpoint.
    audience = issuer.audience
    if not audience:
        audience = tenant_resource(shared_resource(resource_url), issuer.tenant.slug)
        if not same_resource(canonical_resource(resource_url), audience):
            raise JwtRejected("presented at another endpoint", "Access token was not issued for this resource")
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key=key,
            algorithms=[alg],
            audience=audience,
            issuer=issuer.issuer,
            leeway=min(issuer.leeway_s, LEEWAY_S_LIMIT),  # a row stored before the bound
            options={"require": ["exp", "iss", "aud"], "verify_signature": True},
        )
    except jwt.ExpiredSignatureError:
        raise JwtRejected("expired", "Access token expired") from None
    except jwt.ImmatureSignatureError:
        raise JwtRejected("not yet valid (nbf/iat)", "Access token not yet valid") from None
    except jwt.InvalidAudienceError:
        raise JwtRejected("wrong audience", "Access token was not issued for this resource") from None
    except jwt.InvalidIssuerError:
        raise JwtRejected("wrong issuer") from None
    except jwt.InvalidSignatureError:
        raise JwtRejected("bad signature") from None
    except jwt.PyJWTError as exc:
        raise JwtRejected(f"invalid: {type(exc).__name__}") from None
    if issuer.tenant_claim:
        expected = issuer.tenant_claim_value or issuer.tenant.slug
        value = claims.get(issuer.tenant_claim)
        values = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        if value is None or expected not in values:
            raise JwtRejected("tenant claim mismatch", "Access token is not for this tenant")
    return claims


def verify_external_jwt(*, token: str, resource_url: str) -> AuthContext:
    """Verify ``token`` against the active external issuers naming its ``iss``; raise JwtRejected."""
    from tenants.services import get_or_create_principal

    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        raise JwtRejected("not a JWT") from None
    if str(header.get("alg", "")).lower() == "none":
        raise JwtRejected("alg none", "Token algorithm not allowed")
    iss = unverified.get("iss")
    if not isinstance(iss, str):
        raise JwtRejected("no iss")
    rows = list(
        ExternalIssuer.objects.select_related("tenant").filter(issuer=iss, active=True, tenant__active=True)[:100]
    )
    wanted_slug = resource_tenant(resource_url)
    # A tenant's own endpoint: only that tenant's issuers may admit the token...
    issuers = [r for r in rows if wanted_slug is None or r.tenant.slug == wanted_slug]
    if not issuers:
        raise JwtRejected("unknown issuer")
    if len(issuers) > 1 and any(not i.tenant_claim for i in issuers):
        # Several tenants trust this issuer and at least one cannot tell its tokens apart:
        # accepting "the first that verifies" would let one tenant's token into another.
        logger.warning("issuer %r is trusted by %d tenants without a tenant claim on each: refused",
                       iss[:200], len(issuers))
        raise JwtRejected("ambiguous issuer configuration", "Token issuer is not configured unambiguously")
    first_error: JwtRejected | None = None
    matches: list[tuple[ExternalIssuer, dict[str, Any]]] = []
    # ...but every tenant's rows are tried: a token that another tenant's row verifies too is
    # ambiguous (a copied row must not capture it, here or at the shared endpoint).
    for issuer in sorted(rows, key=lambda r: r not in issuers):
        try:
            matches.append((issuer, _verify_with(issuer, token=token, header=header, resource_url=resource_url)))
        except JwtRejected as exc:
            if issuer in issuers:
                first_error = first_error or exc
    if len(matches) > 1:
        logger.warning("a token of issuer %r verifies for %d tenants: refused", iss[:200], len(matches))
        raise JwtRejected("token matches several tenants", "Token issuer is not configured unambiguously")
    matches = [m for m in matches if m[0] in issuers]
    if not matches:
        raise first_error or JwtRejected("verified only for another tenant", "Access token is not for this tenant")
    issuer, claims = matches[0]
    subject = claims.get(issuer.principal_claim)
    if not isinstance(subject, str) or not subject:
        raise JwtRejected(f"missing {issuer.principal_claim} claim")
    kind = Principal.Kind.USER if issuer.principal_claim == "sub" else Principal.Kind.CLIENT
    principal = get_or_create_principal(tenant=issuer.tenant, kind=kind, identifier=subject, issuer=issuer.issuer)
    jti = claims.get("jti")
    ref = f"jwt:{issuer.pk}:{jti}" if isinstance(jti, str) else f"jwt:{issuer.pk}"
    return AuthContext(
        tenant_id=issuer.tenant_id,
        tenant_slug=issuer.tenant.slug,
        principal_id=principal.pk,
        principal_name=principal.name or principal.identifier,
        scopes=_scopes(issuer, claims),
        anonymous=False,
        credential_ref=ref[:200],
        expires_at=float(claims["exp"]) if isinstance(claims.get("exp"), int | float) else None,
    )
