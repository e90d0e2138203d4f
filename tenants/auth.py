"""Authentication of MCP requests: bearer token -> :class:`AuthContext`.

The MCP consumer calls :func:`authenticate` for every request; it either returns the caller's
auth context or raises :class:`AuthError` carrying the HTTP status, headers and JSON body.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tenants import auth_cache
from tenants import conf as tenant_conf
from tenants.auth_fingerprint import is_builtin, token_checksum
from tenants.conf import (
    DEFAULT_CHALLENGE_SCOPES,
    MCP_SCOPES,
    canonical_resource,
    normalize_uri,
    resource_tenant,
    same_resource,
    shared_resource,
)
from tenants.context import AuthContext
from tenants.exceptions import AuthError
from tenants.jwt_issuers import JwtRejected, verify_external_jwt

__all__ = ["AuthContext", "AuthError", "authenticate", "cached_context", "cached_context_due", "forget",
           "insufficient_scope", "prm_url", "remember"]

logger = logging.getLogger(__name__)


# --- challenges ---------------------------------------------------------------------------

AUTH_ERROR_CODE = -32001
_B64TOKEN = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")


def prm_url(resource_url: str) -> str:
    """URL of this resource's Protected Resource Metadata (RFC 9728 §3.1, path-inserted form).

    ``https://host/mcp`` -> ``https://host/.well-known/oauth-protected-resource/mcp``.
    """
    parts = urlsplit(canonical_resource(resource_url))
    path = parts.path.lstrip("/")
    suffix = f"/{path}" if path else ""
    return f"{parts.scheme}://{parts.netloc}/.well-known/oauth-protected-resource{suffix}"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _challenge(*, resource_url: str, scope: str, error: str = "", description: str = "") -> str:
    params: list[tuple[str, str]] = []
    if error:
        params.append(("error", error))
    if description:
        params.append(("error_description", description))
    params.append(("resource_metadata", prm_url(resource_url)))
    if scope:
        params.append(("scope", scope))
    return "Bearer " + ", ".join(f"{k}={_quote(v)}" for k, v in params)


def _body(message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": AUTH_ERROR_CODE, "message": message}
    if data:
        err["data"] = data
    return {"jsonrpc": "2.0", "error": err}


def _unauthorized(*, resource_url: str, message: str, error: str = "invalid_token") -> AuthError:
    """401 with a Bearer challenge; ``error=""`` for a request that carried no token (RFC 6750 §3.1)."""
    header = _challenge(
        resource_url=resource_url,
        scope=" ".join(DEFAULT_CHALLENGE_SCOPES),
        error=error,
        description=message if error else "",
    )
    return AuthError(401, message, headers={"WWW-Authenticate": header}, body=_body(message))


def insufficient_scope(*, scope: str, resource_url: str) -> AuthError:
    """403 for a valid token lacking ``scope`` (RFC 6750 §3.1, MCP authorization "scope challenge")."""
    message = f"Insufficient scope: this request needs {scope}"
    header = _challenge(
        resource_url=resource_url, scope=scope, error="insufficient_scope", description=message
    )
    return AuthError(
        403, message, headers={"WWW-Authenticate": header}, body=_body(message, {"scope": scope})
    )


# --- entry point --------------------------------------------------------------------------


def cached_context(
    *, headers: dict[str, str], query_string: str, resource_url: str
) -> tuple[bytes | None, AuthContext | None]:
    """The cache key of this request's credential and its cached context, if any (no I/O).

    A request with a query string is never answered from the cache (it may carry a token that
    must be refused); pass the key to :func:`remember` after a successful :func:`authenticate`.
    """
    key, ctx, _ = cached_context_due(headers=headers, query_string=query_string, resource_url=resource_url)
    return key, ctx


def cached_context_due(
    *, headers: dict[str, str], query_string: str, resource_url: str
) -> tuple[bytes | None, AuthContext | None, bool]:
    """:func:`cached_context`, and whether the context is due to be verified again ahead of its
    lapse (:meth:`tenants.auth_cache.AuthCache.get_due`; the caller does it in the background)."""
    if query_string:
        return None, None, False
    key = auth_cache.cache.key(authorization=headers.get("authorization", ""), resource_url=resource_url)
    ctx, due = auth_cache.cache.get_due(key)
    return key, ctx, due


def forget(key: bytes) -> None:
    """Drop the cached context of ``key`` (verified again and refused: the next request is refused)."""
    auth_cache.cache.drop(key)


def remember(key: bytes | None, ctx: AuthContext, fingerprint: tuple[Any, ...] | None = None) -> None:
    """Keep a verified context for the next requests with the same credential (see auth_cache),
    with the fingerprint of what it was decided from (:mod:`tenants.auth_fingerprint`), if known."""
    if key is not None:
        auth_cache.cache.put(key, ctx, fingerprint)


def authenticate(*, headers: dict[str, str], query_string: str, resource_url: str) -> AuthContext:
    """Authenticate one MCP request from its headers (names lower-case) and raw query string.

    ``resource_url`` is the absolute URL of the MCP endpoint as the request reached it (e.g.
    ``http://127.0.0.1:8000/mcp``); with ``MCPTASKS_PUBLIC_URL`` set, ``PUBLIC_URL + MCP_PATH``
    is the canonical resource instead. Every token must be meant for that resource.

    Raises :class:`AuthError`: 400 for an ``access_token`` query parameter (RFC 6750 §2.3 is not
    supported, and the token is never looked at), 401 with ``WWW-Authenticate`` for a missing,
    malformed, unknown, expired, revoked or wrong-audience token or a disabled tenant.
    Without an ``Authorization`` header and with ``MCPTASKS_ALLOW_ANONYMOUS`` on, returns the
    anonymous principal of the default tenant. Synchronous (touches the database).
    """
    if query_string and "access_token" in parse_qs(query_string, keep_blank_values=True):
        message = "Access tokens are accepted only in the Authorization header, never in the URL"
        header = _challenge(
            resource_url=resource_url,
            scope=" ".join(DEFAULT_CHALLENGE_SCOPES),
            error="invalid_request",
            description=message,
        )
        raise AuthError(400, message, headers={"WWW-Authenticate": header}, body=_body(message))

    authorization = headers.get("authorization")
    if authorization is None or not authorization.strip():
        if tenant_conf.get().ALLOW_ANONYMOUS:
            return _anonymous_context()
        raise _unauthorized(resource_url=resource_url, message="Authentication required", error="")

    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _unauthorized(resource_url=resource_url, message="Authentication required (Bearer token)")
    if not _B64TOKEN.match(token):
        raise _unauthorized(resource_url=resource_url, message="Malformed bearer token")

    if not is_builtin(token):  # an external JWT
        try:
            return verify_external_jwt(token=token, resource_url=resource_url)
        except JwtRejected as exc:
            logger.info("external JWT refused: %s", exc.reason)
            raise _unauthorized(resource_url=resource_url, message=exc.public_message) from None
    return _builtin_token_context(token=token, resource_url=resource_url)


def _anonymous_context() -> AuthContext:
    from tenants.services import anonymous_principal, default_tenant

    tenant = default_tenant()
    principal = anonymous_principal(tenant=tenant)
    return AuthContext(
        tenant_id=tenant.pk,
        tenant_slug=tenant.slug,
        principal_id=principal.pk,
        principal_name=principal.name or principal.identifier,
        scopes=frozenset(MCP_SCOPES),
        anonymous=True,
        credential_ref="anonymous",
    )


def _builtin_token_context(*, token: str, resource_url: str) -> AuthContext:
    """Resolve a token minted by the built-in authorization server (django-oauth-toolkit)."""
    from oauth2_provider.models import get_access_token_model

    from tenants.models import Principal, TenantMembership
    from tenants.services import get_or_create_principal

    checksum = token_checksum(token)
    model = get_access_token_model()
    # One query for the token, its client, the client's tenant link, tenant and principal.
    access = (
        model.objects.select_related(
            "application", "user", "application__tenant_link__tenant", "application__tenant_link__principal"
        )
        .filter(token_checksum=checksum)
        .first()
    )
    if access is None:
        # Unknown or revoked (DOT deletes revoked access tokens).
        raise _unauthorized(resource_url=resource_url, message="Invalid or revoked access token")
    ref = f"dot:{access.pk}"
    if access.is_expired():
        raise _unauthorized(resource_url=resource_url, message="Access token expired")
    audiences = [normalize_uri(str(a)) for a in (access.resource or [])]
    here = canonical_resource(resource_url)
    wanted_slug = resource_tenant(here)
    # A built-in token names its tenant through its application, so at a tenant's own
    # endpoint a token for the shared endpoint is acceptable too (the tenant is checked below).
    targets = [here, shared_resource(here)] if wanted_slug else [here]
    if audiences and not any(same_resource(t, a) for t in targets for a in audiences):
        logger.info("token %s refused: issued for another resource", ref)
        raise _unauthorized(
            resource_url=resource_url, message="Access token was not issued for this resource"
        )
    application = access.application
    if application is None:
        raise _unauthorized(resource_url=resource_url, message="Access token has no client")
    link = getattr(application, "tenant_link", None)
    if link is None:
        logger.warning("token %s refused: application %s belongs to no tenant", ref, application.pk)
        raise _unauthorized(resource_url=resource_url, message="Client is not registered with a tenant")
    tenant = link.tenant
    if not tenant.active:
        raise _unauthorized(resource_url=resource_url, message="Tenant is disabled")
    if wanted_slug is not None and tenant.slug != wanted_slug:
        logger.info("token %s refused: presented at another tenant's endpoint", ref)
        raise _unauthorized(resource_url=resource_url, message="Access token is not for this tenant")
    # Scopes are bounded by the operator's grants *now*: narrowing an application or a
    # membership applies to tokens already issued.
    granted = link.scope_set()
    if access.user is not None:
        user = access.user
        membership = TenantMembership.objects.filter(tenant_id=tenant.pk, user_id=user.pk).first()
        if membership is None:
            logger.warning("token %s refused: user is not a member of tenant %s", ref, tenant.pk)
            raise _unauthorized(resource_url=resource_url, message="User is not a member of this tenant")
        granted = granted & membership.scope_set()
        principal = get_or_create_principal(
            tenant=tenant, kind=Principal.Kind.USER, identifier=user.get_username(), name=user.get_username()
        )
    elif link.principal is not None:
        if link.principal.tenant_id != tenant.pk:
            # A link to another tenant's principal (a forged or raw write) never acts as it.
            logger.warning("token %s refused: application %s names a principal of another tenant",
                           ref, application.pk)
            raise _unauthorized(resource_url=resource_url, message="Client is not registered with a tenant")
        principal = link.principal
    else:
        principal = get_or_create_principal(
            tenant=tenant, kind=Principal.Kind.CLIENT, identifier=application.client_id, name=application.name
        )
    return AuthContext(
        tenant_id=tenant.pk,
        tenant_slug=tenant.slug,
        principal_id=principal.pk,
        principal_name=principal.name or principal.identifier,
        scopes=frozenset(access.scope.split()) & granted,
        anonymous=False,
        credential_ref=ref,
        expires_at=access.expires.timestamp() if access.expires else None,
    )
