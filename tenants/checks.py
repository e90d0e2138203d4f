"""System checks for the tenants app."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from tenants import conf as tenant_conf

#: Upper bound of the counters' Redis pool (connection budgets, docs/operations.md).
MAX_REDIS_POOL = 500


@register()
def tenant_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """tenants.W002: the default task ttl exceeds the maximum; tenants.W003: unknown settings keys;
    tenants.W004: a ttl or pollInterval setting above its hard bound (clamped); tenants.E004: bad
    outbound networks; tenants.E005: a malformed trusted-proxy list."""
    s = tenant_conf.get()
    problems: list[CheckMessage] = []
    if s.TASK_DEFAULT_TTL_MS > s.TASK_MAX_TTL_MS:
        problems.append(Warning(
            "MCPTASKS_TASK_DEFAULT_TTL_MS exceeds MCPTASKS_TASK_MAX_TTL_MS; the default is clamped to the max.",
            id="tenants.W002",
        ))
    if s.TASK_POLL_INTERVAL_MS < 1:
        problems.append(Error("MCPTASKS_TASK_POLL_INTERVAL_MS must be at least 1.", id="tenants.E002"))
    from tenants.outbound import invalid_networks

    for entry in invalid_networks(tuple(s.OUTBOUND_ALLOWED_NETWORKS)):
        problems.append(Error(f"MCPTASKS_OUTBOUND_ALLOWED_NETWORKS: {entry[:100]!r} is not a network (CIDR).",
                              hint="Use e.g. 10.20.0.0/16 or fd00::/8; invalid entries allow nothing.",
                              id="tenants.E004"))
    from tenants.models import POLL_INTERVAL_MS_LIMIT, TTL_MS_LIMIT

    for name, value, bound in (("TASK_DEFAULT_TTL_MS", s.TASK_DEFAULT_TTL_MS, TTL_MS_LIMIT),
                               ("TASK_MAX_TTL_MS", s.TASK_MAX_TTL_MS, TTL_MS_LIMIT),
                               ("TASK_POLL_INTERVAL_MS", s.TASK_POLL_INTERVAL_MS, POLL_INTERVAL_MS_LIMIT)):
        if value > bound:
            problems.append(Warning(f"MCPTASKS_{name} ({value}) exceeds its bound {bound}; it is clamped to it.",
                                    id="tenants.W004"))
    from tenants.clientaddr import parse_networks

    try:
        parse_networks(s.TRUSTED_PROXIES)
    except ValueError as exc:
        problems.append(Error(f"MCPTASKS_TRUSTED_PROXIES has a malformed entry ({exc}); no proxy is trusted.",
                              hint="List CIDRs or addresses, comma-separated (e.g. 127.0.0.1/32,10.0.0.0/8).",
                              id="tenants.E005"))
    if not 1 <= s.REDIS_POOL_SIZE <= MAX_REDIS_POOL:
        problems.append(Error(f"MCPTASKS_REDIS_POOL_SIZE must be between 1 and {MAX_REDIS_POOL}.",
                              hint="One sync pool and one per event loop of this size per process: see the budget "
                              "in docs/operations.md.", id="tenants.E012"))
    for key in tenant_conf.unknown_keys():
        problems.append(Warning(f"settings.TENANTS has an unknown key {key!r}.",
                                hint="Check its spelling against docs/settings.md.", id="tenants.W003"))
    return problems


@register()
def redis_url_supported(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """tenants.E010: REDIS_URL malformed or unsupported; tenants.E011: it names Redis Cluster (scheme or node)."""
    from tenants.infra import redis_url

    return [
        Error(message, hint="See docs/operations.md, \"Redis: Sentinel, not Cluster\".", id=f"tenants.{code}")
        for code, message in redis_url.problems(str(getattr(settings, "REDIS_URL", "") or ""))
    ]


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


def _issuer_table_exists() -> bool:
    """Whether the issuers' table exists: ``migrate`` runs these checks before it creates the
    tables, and a query failing there would put an ERROR line in the database server's log of
    every fresh deployment."""
    from django.db import connection

    from tenants.models import ExternalIssuer

    return ExternalIssuer._meta.db_table in connection.introspection.table_names()


def _issuers_of_several_tenants(limit: int = 1000) -> list[str]:
    """Issuers (at most ``limit``) that active rows of more than one tenant trust."""
    from django.db.models import Count

    from tenants.models import ExternalIssuer

    return list(
        ExternalIssuer.objects.filter(active=True)
        .values("issuer")
        .annotate(tenants=Count("tenant", distinct=True))
        .filter(tenants__gt=1)
        .values_list("issuer", flat=True)[:limit]
    )


@register(Tags.database)
def shared_issuers_name_their_tenant(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """tenants.E001: an issuer trusted by several tenants without a tenant claim on each."""
    from django.db import DatabaseError

    from tenants.models import ExternalIssuer

    try:
        if not _issuer_table_exists():
            return []  # before migrate: no query on a table that is not there
        shared = _issuers_of_several_tenants()
        bad = sorted(
            set(ExternalIssuer.objects.filter(active=True, issuer__in=shared, tenant_claim="")
                .values_list("issuer", flat=True))
        )
    except DatabaseError:
        return []  # the database unreachable: nothing to check the rows against
    return [
        Error(
            f"External issuer {iss!r} is trusted by several tenants, not all of which name a tenant claim.",
            hint="Set tenant_claim (and tenant_claim_value) on every tenant's row for this issuer; "
            "until then its tokens are refused.",
            id="tenants.E001",
        )
        for iss in bad[:20]
    ]


@register(Tags.database)
def issuer_rows_never_share_a_token(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """tenants.E003: two tenants' rows of one issuer could verify the same token (see ExternalIssuer.overlaps)."""
    from django.db import DatabaseError

    from tenants.models import ExternalIssuer

    try:
        if not _issuer_table_exists():
            return []  # before migrate: no query on a table that is not there
        shared = _issuers_of_several_tenants()
        rows = list(ExternalIssuer.objects.filter(active=True, issuer__in=shared).select_related("tenant"))
    except DatabaseError:
        return []  # the database unreachable: nothing to check the rows against
    bad: set[str] = set()
    for i, row in enumerate(rows):
        if any(o.tenant_id != row.tenant_id and row.overlaps(o) for o in rows[i + 1:]):
            bad.add(row.issuer)
    return [
        Error(
            f"External issuer {iss!r} is trusted by several tenants whose rows could verify the same token "
            "(same audience, overlapping tenant claim).",
            hint="Give each tenant's row its own audience (blank: the tenant's endpoint) or its own tenant "
            "claim value; until then such tokens are refused at every endpoint.",
            id="tenants.E003",
        )
        for iss in sorted(bad)[:20]
    ]
