"""Operator roles: who may see and manage which tenants in the admin, the dashboard and the audit API.

- A **superuser** sees and manages everything.
- The **auditor** group is read-only (tasks, audit events, sessions, workers, tenants). With the
  ``tenants.audit_all_tenants`` permission (``mcptasks_tenant operator --all-tenants``) an auditor
  sees every tenant; otherwise only the tenants where their membership's role is ``auditor``.
- A **tenant admin** (membership role ``admin``, in the ``tenant admin`` group) manages one
  tenant: its name, principals, members, applications and issuers, and cancels its tasks. Its
  suspension, slug, quotas, rate limits and ttl bounds stay the superuser's
  (:data:`OPERATOR_ONLY_TENANT_FIELDS`, read-only in the admin).

Model permissions come from the two groups (each app adds its own models' permissions, see
:func:`grant_group_permissions`); *which rows* come from :func:`tenants.access.visible_tenant_ids` and
:func:`~tenants.access.managed_tenant_ids`, the one place that decides it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.db import models

AUDITOR_GROUP = "auditor"
TENANT_ADMIN_GROUP = "tenant admin"

#: Permission that lifts an auditor's tenant scope (every tenant, still read-only).
AUDIT_ALL_TENANTS = "tenants.audit_all_tenants"

#: Fields of a tenant only superusers change: a tenant admin sees them read-only (the tenant
#: admin page), so a tenant cannot lift its own suspension, quotas, rate limits or ttl bounds,
#: nor move its endpoint. Every limit column of ``tenants.models.TENANT_LIMIT_BOUNDS`` is here.
OPERATOR_ONLY_TENANT_FIELDS: tuple[str, ...] = (
    "slug", "active",
    "max_concurrent_tasks", "max_concurrent_tasks_per_principal",
    "default_ttl_ms", "max_ttl_ms", "poll_interval_ms",
    "rate_create_per_min", "rate_read_per_min", "rate_other_per_min",
)


class Role(models.TextChoices):
    """What a membership lets its user do beyond getting MCP tokens."""

    MEMBER = "member", "Member (MCP tokens only)"
    AUDITOR = "auditor", "Auditor (read-only)"
    ADMIN = "admin", "Tenant admin"


#: The tenants app's own permissions per group (the MCP app adds its models' in its ready()).
TENANT_GROUP_PERMISSIONS: dict[str, tuple[str, ...]] = {
    AUDITOR_GROUP: ("view_tenant", "view_principal", "view_tenantmembership", "view_tenantapplication",
                    "view_webhookendpoint"),
    TENANT_ADMIN_GROUP: (
        "view_tenant", "change_tenant",
        "view_principal", "add_principal", "change_principal",
        "view_tenantmembership", "add_tenantmembership", "change_tenantmembership", "delete_tenantmembership",
        "view_tenantapplication", "change_tenantapplication",
        "view_externalissuer", "add_externalissuer", "change_externalissuer", "delete_externalissuer",
        "view_webhookendpoint", "add_webhookendpoint", "change_webhookendpoint", "delete_webhookendpoint",
    ),
}


def grant_group_permissions(app_label: str, per_group: Mapping[str, Iterable[str]]) -> None:
    """Create the operator groups if needed and give them ``app_label``'s listed permissions."""
    from django.contrib.auth.models import Group, Permission

    for name, codenames in per_group.items():
        group, _ = Group.objects.get_or_create(name=name)
        perms = Permission.objects.filter(content_type__app_label=app_label, codename__in=list(codenames))
        group.permissions.add(*perms)
