"""Write-side helpers for tenants, principals and built-in-AS credentials."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from oauth2_provider.models import get_access_token_model, get_application_model, set_token_value
from oauth2_provider.settings import oauth2_settings

from tenants import conf as tenant_conf
from tenants.conf import KNOWN_SCOPES, normalize_uri
from tenants.models import (
    LEAST_PRIVILEGE_SCOPES,
    Principal,
    Tenant,
    TenantApplication,
    TenantMembership,
    WebhookEndpoint,
    new_webhook_secret,
)

ANONYMOUS_IDENTIFIER = "anonymous"


def get_or_create_tenant(*, slug: str, name: str = "") -> Tenant:
    """The tenant ``slug``, created (active, no limits) if missing."""
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    return tenant


def default_tenant() -> Tenant:
    """The tenant named by ``MCPTASKS_DEFAULT_TENANT`` (created on demand)."""
    return get_or_create_tenant(slug=tenant_conf.get().DEFAULT_TENANT)


def get_or_create_principal(
    *, tenant: Tenant, kind: str, identifier: str, name: str = "", issuer: str = ""
) -> Principal:
    """The principal ``(tenant, kind, issuer, identifier)``, created if missing (race-safe).

    ``issuer`` is the external issuer vouching for the identity ("" for local ones), so equal
    subjects from different issuers are different principals.
    """
    key = {"tenant": tenant, "kind": kind, "issuer": issuer[:500], "identifier": identifier[:255]}
    try:
        principal, _ = Principal.objects.get_or_create(**key, defaults={"name": name[:200]})
    except IntegrityError:  # a concurrent request created it first
        principal = Principal.objects.get(**key)
    return principal


def anonymous_principal(*, tenant: Tenant) -> Principal:
    """The single anonymous principal of ``tenant``."""
    return get_or_create_principal(
        tenant=tenant, kind=Principal.Kind.ANONYMOUS, identifier=ANONYMOUS_IDENTIFIER, name="anonymous"
    )


def _check_scopes(scopes: list[str]) -> list[str]:
    unknown = [s for s in scopes if s not in KNOWN_SCOPES]
    if unknown:
        raise ValueError(f"unknown scope(s): {' '.join(unknown)}; known: {' '.join(KNOWN_SCOPES)}")
    return scopes


def create_client_application(
    *, tenant: Tenant, principal_name: str, scopes: list[str] | None = None, owner: Any = None
) -> tuple[TenantApplication, str]:
    """A confidential client-credentials application of ``tenant`` and its client principal.

    ``scopes`` are the scopes the operator grants it (default: the least privilege,
    ``mcp:tools mcp:tasks``). ``owner`` is the Django user it acts for on the audit-review API
    (an auditor's application with ``audit:read``: the API checks the owner's role each request).
    Returns the link row and the client secret in plaintext (stored hashed; shown only once).
    """
    app_model = get_application_model()
    secret = secrets.token_urlsafe(32)
    with transaction.atomic():
        app = app_model.objects.create(
            name=f"{tenant.slug}:{principal_name}"[:255],
            client_type=app_model.CLIENT_CONFIDENTIAL,
            authorization_grant_type=app_model.GRANT_CLIENT_CREDENTIALS,
            client_secret=secret,
            hash_client_secret=True,
            user=owner,
        )
        principal = get_or_create_principal(
            tenant=tenant, kind=Principal.Kind.CLIENT, identifier=app.client_id, name=principal_name
        )
        link = TenantApplication.objects.create(
            application=app, tenant=tenant, principal=principal,
            allowed_scopes=" ".join(_check_scopes(scopes)) if scopes else LEAST_PRIVILEGE_SCOPES,
        )
    return link, secret


def create_authorization_code_application(
    *, tenant: Tenant, name: str, redirect_uris: list[str], confidential: bool = False,
    scopes: list[str] | None = None,
) -> tuple[TenantApplication, str | None]:
    """An interactive (authorization code + PKCE S256) application of ``tenant``.

    Public by default (no secret; PKCE protects the code). Returns the link and the plaintext
    client secret for a confidential client, else None. Tokens act as the resource owner
    (a ``user`` principal named by the Django username).
    """
    app_model = get_application_model()
    secret = secrets.token_urlsafe(32) if confidential else ""
    with transaction.atomic():
        app = app_model.objects.create(
            name=f"{tenant.slug}:{name}"[:255],
            client_type=app_model.CLIENT_CONFIDENTIAL if confidential else app_model.CLIENT_PUBLIC,
            authorization_grant_type=app_model.GRANT_AUTHORIZATION_CODE,
            redirect_uris=" ".join(redirect_uris),
            client_secret=secret,
            hash_client_secret=True,
        )
        link = TenantApplication.objects.create(
            application=app, tenant=tenant,
            allowed_scopes=" ".join(_check_scopes(scopes)) if scopes else LEAST_PRIVILEGE_SCOPES,
        )
    return link, (secret or None)


def _cli_application(*, tenant: Tenant, principal_name: str) -> TenantApplication:
    app_model = get_application_model()
    link = (
        TenantApplication.objects.select_related("application", "principal")
        .filter(
            tenant=tenant,
            principal__name=principal_name,
            principal__kind=Principal.Kind.CLIENT,
            application__authorization_grant_type=app_model.GRANT_CLIENT_CREDENTIALS,
        )
        .order_by("pk")
        .first()
    )
    if link is None:
        link, _secret = create_client_application(tenant=tenant, principal_name=principal_name)
    return link


def default_token_resource() -> str | None:
    """Resource (audience) of tokens minted without a request: ``PUBLIC_URL + MCP_PATH`` or None."""
    c = tenant_conf.get()
    return normalize_uri(c.PUBLIC_URL.rstrip("/") + c.MCP_PATH) if c.PUBLIC_URL else None


def issue_token(
    *,
    tenant: Tenant,
    principal_name: str = "cli",
    scopes: list[str] | None = None,
    expires_s: int | None = None,
    resource: str | None = None,
) -> str:
    """Mint an access token of the built-in AS for ``principal_name`` in ``tenant``.

    Creates (or reuses) a confidential client-credentials application for that principal.
    ``scopes`` defaults to ``mcp:tools mcp:tasks``; ``expires_s`` to
    ``MCPTASKS_ACCESS_TOKEN_EXPIRE_S``. ``resource`` (RFC 8707 audience) defaults to
    ``PUBLIC_URL + MCP_PATH``; without PUBLIC_URL and without ``resource`` the token is bound
    to no particular URL of this server (DOT's "unrestricted" token) — pass the MCP endpoint
    URL (e.g. ``http://127.0.0.1:8000/mcp``) to bind it. Only the SHA-256 checksum is stored;
    the plaintext is returned exactly once.
    """
    scope_list = _check_scopes(list(scopes) if scopes else list(oauth2_settings.DEFAULT_SCOPES))
    link = _cli_application(tenant=tenant, principal_name=principal_name)
    missing = set(scope_list) - link.scope_set()
    if missing:
        # The operator at the command line grants what they mint (clients never can).
        link.allowed_scopes = " ".join(sorted(link.scope_set() | missing))
        link.save(update_fields=["allowed_scopes"])
    lifetime = expires_s if expires_s is not None else oauth2_settings.ACCESS_TOKEN_EXPIRE_SECONDS
    bound = normalize_uri(resource) if resource else default_token_resource()
    raw = secrets.token_urlsafe(32)
    token_model = get_access_token_model()
    access = token_model(
        application=link.application,
        user=None,
        expires=timezone.now() + timedelta(seconds=lifetime),
        scope=" ".join(scope_list),
        resource=[bound] if bound else [],
    )
    set_token_value(access, raw)
    access.save()
    return raw


def add_member(*, tenant: Tenant, user: Any, scopes: list[str] | None = None) -> TenantMembership:
    """Make ``user`` a member of ``tenant`` with ``scopes`` (default: least privilege)."""
    allowed = " ".join(_check_scopes(scopes)) if scopes else LEAST_PRIVILEGE_SCOPES
    membership, _ = TenantMembership.objects.update_or_create(
        tenant=tenant, user=user, defaults={"allowed_scopes": allowed}
    )
    return membership


def grant_operator_role(*, user: Any, tenant: Tenant | None, role: str) -> None:
    """Make ``user`` an operator: ``role`` is ``auditor`` or ``admin`` (tenant admin) of ``tenant``;
    ``tenant=None`` with ``auditor`` means an auditor of every tenant (see tenants/roles.py)."""
    from django.contrib.auth.models import Group, Permission

    from tenants.roles import AUDITOR_GROUP, TENANT_ADMIN_GROUP, Role

    if role not in (Role.AUDITOR, Role.ADMIN):
        raise ValueError(f"unknown operator role {role!r} (auditor or admin)")
    if tenant is None and role != Role.AUDITOR:
        raise ValueError("only auditors can be given every tenant")
    group, _ = Group.objects.get_or_create(name=AUDITOR_GROUP if role == Role.AUDITOR else TENANT_ADMIN_GROUP)
    with transaction.atomic():
        user.is_staff = True
        user.save(update_fields=["is_staff"])
        user.groups.add(group)
        if tenant is None:
            user.user_permissions.add(Permission.objects.get(content_type__app_label="tenants",
                                                             codename="audit_all_tenants"))
        else:
            TenantMembership.objects.update_or_create(tenant=tenant, user=user, defaults={"role": role})


def add_webhook_endpoint(
    *, tenant: Tenant, url: str, principal: Principal | None = None, events: list[str] | None = None
) -> WebhookEndpoint:
    """Register a webhook endpoint of ``tenant`` (validated like the admin form); its secret is new."""
    endpoint = WebhookEndpoint(tenant=tenant, principal=principal, url=url)
    if events:
        endpoint.events = list(dict.fromkeys(events))
    endpoint.full_clean()
    endpoint.save()
    return endpoint


def rotate_webhook_secret(*, endpoint: WebhookEndpoint) -> str:
    """Give ``endpoint`` a new signing secret; the old one still signs for ``WEBHOOK_SECRET_OVERLAP_S``.

    Returns the new secret (shown once). Both are stored encrypted.
    """
    overlap = tenant_conf.get().WEBHOOK_SECRET_OVERLAP_S
    endpoint.previous_secret = endpoint.secret
    endpoint.previous_secret_expires_at = timezone.now() + timedelta(seconds=overlap)
    endpoint.secret = new_webhook_secret()
    endpoint.save(update_fields=["previous_secret", "previous_secret_expires_at", "secret"])
    return endpoint.secret
