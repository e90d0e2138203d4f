"""System checks for the tenants app."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from . import conf as tenant_conf


@register()
def tenant_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """tenants.W002: the default task ttl exceeds the maximum; tenants.W003: unknown settings keys."""
    s = tenant_conf.get()
    problems: list[CheckMessage] = []
    if s.TASK_DEFAULT_TTL_MS > s.TASK_MAX_TTL_MS:
        problems.append(Warning(
            "MCPTASKS_TASK_DEFAULT_TTL_MS exceeds MCPTASKS_TASK_MAX_TTL_MS; the default is clamped to the max.",
            id="tenants.W002",
        ))
    if s.TASK_POLL_INTERVAL_MS < 1:
        problems.append(Error("MCPTASKS_TASK_POLL_INTERVAL_MS must be at least 1.", id="tenants.E002"))
    for key in tenant_conf.unknown_keys():
        problems.append(Warning(f"settings.TENANTS has an unknown key {key!r}.",
                                hint="Check its spelling against docs/settings.md.", id="tenants.W003"))
    return problems


@register()
def anonymous_without_debug(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """tenants.W001: anonymous access is on while DEBUG is off (a production-like setup)."""
    if tenant_conf.get().ALLOW_ANONYMOUS and not settings.DEBUG:
        return [
            Warning(
                "MCPTASKS_ALLOW_ANONYMOUS is on with DEBUG off: anyone who can reach the server "
                f"acts as the anonymous principal of tenant {tenant_conf.get().DEFAULT_TENANT!r}.",
                hint="Unset MCPTASKS_ALLOW_ANONYMOUS and issue tokens (manage.py mcptasks_tenant token).",
                id="tenants.W001",
            )
        ]
    return []


@register(Tags.database)
def shared_issuers_name_their_tenant(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """tenants.E001: an issuer trusted by several tenants without a tenant claim on each."""
    from django.db import DatabaseError
    from django.db.models import Count

    from .models import ExternalIssuer

    try:
        shared = list(
            ExternalIssuer.objects.filter(active=True)
            .values("issuer")
            .annotate(tenants=Count("tenant", distinct=True))
            .filter(tenants__gt=1)
            .values_list("issuer", flat=True)
        )
        bad = sorted(
            set(ExternalIssuer.objects.filter(active=True, issuer__in=shared, tenant_claim="")
                .values_list("issuer", flat=True))
        )
    except DatabaseError:
        return []  # no tables yet (before migrate)
    return [
        Error(
            f"External issuer {iss!r} is trusted by several tenants, not all of which name a tenant claim.",
            hint="Set tenant_claim (and tenant_claim_value) on every tenant's row for this issuer; "
            "until then its tokens are refused.",
            id="tenants.E001",
        )
        for iss in bad[:20]
    ]
