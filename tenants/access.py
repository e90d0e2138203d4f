"""Which tenants an operator (a Django user) may read or change, from their memberships.

The roles and groups themselves are in :mod:`tenants.roles` (no model imports: the apps' configs
read them while the registry loads); this module reads the memberships.
"""

from __future__ import annotations

from typing import Any

from tenants.models import TenantMembership
from tenants.roles import AUDIT_ALL_TENANTS, Role


def _is_all_seeing(user: Any) -> bool:
    return bool(user.is_superuser or user.has_perm(AUDIT_ALL_TENANTS))


def visible_tenant_ids(user: Any) -> frozenset[int] | None:
    """Tenants ``user`` may read as an operator: None means every tenant."""
    if not getattr(user, "is_active", False):
        return frozenset()
    if _is_all_seeing(user):
        return None
    return frozenset(
        TenantMembership.objects.filter(user=user, role__in=(Role.AUDITOR, Role.ADMIN)).values_list(
            "tenant_id", flat=True
        )
    )


def managed_tenant_ids(user: Any) -> frozenset[int] | None:
    """Tenants ``user`` may change as an operator: None means every tenant."""
    if not getattr(user, "is_active", False):
        return frozenset()
    if user.is_superuser:
        return None
    return frozenset(
        TenantMembership.objects.filter(user=user, role=Role.ADMIN).values_list("tenant_id", flat=True)
    )


def scope_queryset(qs: Any, ids: frozenset[int] | None, *, field: str = "tenant_id") -> Any:
    """``qs`` limited to the tenants ``ids`` (None: unchanged)."""
    return qs if ids is None else qs.filter(**{f"{field}__in": ids})
