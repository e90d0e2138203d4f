"""Plain functions behind ``manage.py mcptasks_tenant``: each returns the lines to print."""

from __future__ import annotations

from .models import Tenant
from .services import (
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
    scopes: list[str] | None = None,
) -> list[str]:
    """Register an OAuth application of ``slug`` granted ``scopes``; prints client_id (and a secret, once)."""
    tenant = _tenant(slug)
    if scopes:
        _known(scopes)
    if grant == "client-credentials":
        link, secret = create_client_application(tenant=tenant, principal_name=name, scopes=scopes)
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
    from .quotas import recount_active_tasks

    tenant_id = _tenant(slug).pk if slug else None
    fixed = recount_active_tasks(tenant_id=tenant_id)
    return [f"recounted: {fixed} counter(s) corrected"]


def _known(scopes: list[str]) -> None:
    from .conf import MCP_SCOPES

    unknown = [s for s in scopes if s not in MCP_SCOPES]
    if unknown:
        raise CliError(f"unknown scope(s): {' '.join(unknown)}; known: {' '.join(MCP_SCOPES)}")


def member(*, slug: str, username: str, scopes: list[str] | None = None) -> list[str]:
    """Make the Django user ``username`` a member of ``slug`` (authorization-code tokens)."""
    from django.contrib.auth import get_user_model

    from .services import add_member

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

    from .services import grant_operator_role

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
