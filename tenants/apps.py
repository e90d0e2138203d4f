from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class TenantsConfig(AppConfig):
    """Tenants and OAuth."""

    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Tenants"

    def ready(self) -> None:
        from tenants import auth_cache, checks, quotas  # noqa: F401  (checks registers system checks)

        auth_cache.connect_invalidation()
        quotas.connect_recount()
        post_migrate.connect(_operator_groups, sender=self, dispatch_uid="tenants.operator_groups")


def _operator_groups(**_: Any) -> None:
    """The auditor and tenant-admin groups with this app's permissions (after every migrate)."""
    from tenants.roles import TENANT_GROUP_PERMISSIONS, grant_group_permissions

    grant_group_permissions("tenants", TENANT_GROUP_PERMISSIONS)
