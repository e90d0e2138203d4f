"""System checks for the tenants app."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from mcptasks import conf as mcp_conf


@register()
def anonymous_without_debug(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """tenants.W001: anonymous access is on while DEBUG is off (a production-like setup)."""
    if mcp_conf.get().ALLOW_ANONYMOUS and not settings.DEBUG:
        return [
            Warning(
                "MCPTASKS_ALLOW_ANONYMOUS is on with DEBUG off: anyone who can reach the server "
                f"acts as the anonymous principal of tenant {mcp_conf.get().DEFAULT_TENANT!r}.",
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
