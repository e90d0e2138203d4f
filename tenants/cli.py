"""Plain functions behind ``manage.py mcptasks_tenant``: each returns the lines to print."""

from __future__ import annotations

from tenants.models import Tenant
from tenants.services import (
    create_authorization_code_application,
    create_client_application,
    get_or_create_tenant,
    issue_token,
)


class CliError(Exception):
    """A user error (unknown tenant, bad scope): print the message and exit non-zero."""


def _tenant(slug: str) -> Tenant:
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise CliError(f"unknown tenant {slug!r} (create it with: mcptasks_tenant create {slug})")
    return tenant


def create(*, slug: str, name: str = "") -> list[str]:
    """Create tenant ``slug`` (idempotent)."""
    existed = Tenant.objects.filter(slug=slug).exists()
    tenant = get_or_create_tenant(slug=slug, name=name)
    return [f"tenant {tenant.slug} {'already exists' if existed else 'created'} (id {tenant.pk})"]


def token(
    *,
    slug: str,
    principal: str = "cli",
    scopes: list[str] | None = None,
    expires_s: int | None = None,
    resource: str | None = None,
) -> list[str]:
    """Mint a bearer token for ``principal`` in ``slug``; the token is the last line."""
    tenant = _tenant(slug)
    try:
        raw = issue_token(
            tenant=tenant, principal_name=principal, scopes=scopes, expires_s=expires_s, resource=resource
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return [f"# bearer token for tenant {tenant.slug}, principal {principal} (shown once):", raw]


def list_tenants() -> list[str]:
    """One line per tenant with its live counters."""
    lines = []
    for t in Tenant.objects.all():
        lines.append(
            f"{t.slug}\t{'active' if t.active else 'disabled'}\tactive_tasks={t.active_tasks}"
            f"\tprincipals={t.principals.count()}\tmax_concurrent={t.max_concurrent_tasks or '-'}"
        )
    return lines or ["(no tenants)"]


def app(
    *, slug: str, name: str, grant: str = "client-credentials", redirect_uris: list[str] | None = None,
    scopes: list[str] | None = None, owner: str | None = None,
) -> list[str]:
    """Register an OAuth application of ``slug`` granted ``scopes``; prints client_id (and a secret, once).

    ``owner`` (client credentials only) is the username of the operator the application's tokens
    act for on the audit-review API (with ``audit:read``; the API checks the role each request).
    """
    from django.contrib.auth import get_user_model

    tenant = _tenant(slug)
    if scopes:
        _known(scopes)
    if owner is not None and grant != "client-credentials":
        raise CliError("--owner is for client-credentials applications (authorization-code tokens act for "
                       "the signed-in user)")
    owner_user = None
    if owner is not None:
        owner_user = get_user_model().objects.filter(username=owner).first()
        if owner_user is None:
            raise CliError(f"unknown user {owner!r}")
    if grant == "client-credentials":
        link, secret = create_client_application(tenant=tenant, principal_name=name, scopes=scopes,
                                                 owner=owner_user)
        return [f"client_id={link.application.client_id}", f"client_secret={secret}"]
    if not redirect_uris:
        raise CliError("--redirect-uri is required for authorization-code applications")
    link, maybe_secret = create_authorization_code_application(
        tenant=tenant, name=name, redirect_uris=redirect_uris, scopes=scopes
    )
    lines = [f"client_id={link.application.client_id}", "client_type=public (PKCE S256 required)"]
    if maybe_secret:
        lines.append(f"client_secret={maybe_secret}")
    return lines


def recount(*, slug: str | None = None) -> list[str]:
    """Repair the active-task counters of one tenant (or all) from the task table."""
    from tenants.quotas import recount_active_tasks

    tenant_id = _tenant(slug).pk if slug else None
    fixed = recount_active_tasks(tenant_id=tenant_id)
    return [f"recounted: {fixed} counter(s) corrected"]


def _known(scopes: list[str]) -> None:
    from tenants.conf import KNOWN_SCOPES

    unknown = [s for s in scopes if s not in KNOWN_SCOPES]
    if unknown:
        raise CliError(f"unknown scope(s): {' '.join(unknown)}; known: {' '.join(KNOWN_SCOPES)}")


def member(*, slug: str, username: str, scopes: list[str] | None = None) -> list[str]:
    """Make the Django user ``username`` a member of ``slug`` (authorization-code tokens)."""
    from django.contrib.auth import get_user_model

    from tenants.services import add_member

    tenant = _tenant(slug)
    if scopes:
        _known(scopes)
    user = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: username}).first()
    if user is None:
        raise CliError(f"no user {username!r}")
    membership = add_member(tenant=tenant, user=user, scopes=scopes)
    return [f"member {username} of {slug}: {membership.allowed_scopes}"]


def operator(*, username: str, role: str, slug: str | None) -> list[str]:
    """Make ``username`` (created with a printed password if new) an auditor or tenant admin."""
    import secrets as _secrets

    from django.contrib.auth import get_user_model

    from tenants.services import grant_operator_role

    tenant = _tenant(slug) if slug else None
    user_model = get_user_model()
    user = user_model.objects.filter(**{user_model.USERNAME_FIELD: username}).first()
    lines = []
    if user is None:
        password = _secrets.token_urlsafe(12)
        user = user_model.objects.create_user(username=username, password=password)
        lines.append(f"created user {username} with password {password} (shown once; change it at /admin/)")
    try:
        grant_operator_role(user=user, tenant=tenant, role=role)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    where = f"tenant {slug}" if slug else "every tenant"
    return [*lines, f"{username} is now {'an auditor' if role == 'auditor' else 'a tenant admin'} of {where}"]


def webhook_add(*, slug: str, url: str, principal: str | None = None, events: list[str] | None = None) -> list[str]:
    """Register a webhook endpoint of ``slug``; its signing secret (``whsec_…``) is the last line."""
    from django.core.exceptions import ValidationError

    from tenants.models import WEBHOOK_EVENTS, Principal
    from tenants.services import add_webhook_endpoint

    tenant = _tenant(slug)
    who = None
    if principal is not None:
        # By name (what `token --principal NAME` set), else by raw identifier (a client_id, a sub).
        who = (Principal.objects.filter(tenant=tenant, name=principal).order_by("pk").first()
               or Principal.objects.filter(tenant=tenant, identifier=principal).order_by("pk").first())
        if who is None:
            raise CliError(f"no principal {principal!r} in tenant {slug}")
    unknown = [e for e in events or [] if e not in WEBHOOK_EVENTS]
    if unknown:
        raise CliError(f"unknown event(s): {' '.join(unknown)}; known: {' '.join(WEBHOOK_EVENTS)}")
    try:
        endpoint = add_webhook_endpoint(tenant=tenant, url=url, principal=who, events=events)
    except ValidationError as exc:
        raise CliError("; ".join(exc.messages)) from None
    return [
        f"webhook endpoint {endpoint.pk} of tenant {slug}{f', principal {principal}' if principal else ''}: "
        f"{' '.join(endpoint.events)}",
        "# signing secret (shown once):",
        endpoint.secret,
    ]


def webhook_rotate(*, endpoint_id: int) -> list[str]:
    """Rotate an endpoint's signing secret; the new secret is the last line."""
    from tenants.models import WebhookEndpoint
    from tenants.services import rotate_webhook_secret

    endpoint = WebhookEndpoint.objects.filter(pk=endpoint_id).first()
    if endpoint is None:
        raise CliError(f"no webhook endpoint {endpoint_id}")
    secret = rotate_webhook_secret(endpoint=endpoint)
    return [f"webhook endpoint {endpoint.pk}: new signing secret (the old one signs too until "
            f"{endpoint.previous_secret_expires_at:%Y-%m-%dT%H:%M:%SZ}):", secret]


def webhook_list(*, slug: str) -> list[str]:
    """One line per webhook endpoint of ``slug`` (never the secret)."""
    tenant = _tenant(slug)
    return [
        f"{e.pk}\t{'enabled' if e.enabled else 'disabled'}\t{e.url}\t{e.principal if e.principal else '*'}"
        f"\t{' '.join(e.events)}"
        for e in tenant.webhook_endpoints.select_related("principal").order_by("pk")
    ] or ["(no webhook endpoints)"]
