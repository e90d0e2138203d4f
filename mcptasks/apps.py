from typing import Any

from django.apps import AppConfig


class McpTasksConfig(AppConfig):
    """The MCP server: sessions, tasks, streams and the tool registry."""

    name = "mcptasks"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "MCP tasks"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from tenants.signals import security_event

        from . import checks  # noqa: F401  (registers system checks)

        security_event.connect(_audit_security_event, dispatch_uid="mcptasks.audit_security_event")

        # Tools, resources and prompts live in each installed app's tools.py, like admin.py.
        autodiscover_modules("tools")


def _audit_security_event(*, action: str, tenant_id: int | None, data: dict[str, Any], **_: Any) -> None:
    """Record a security event of the tenants app (refused scopes, non-members, throttling)."""
    from .services import record_audit_ids

    record_audit_ids(tenant_id=tenant_id, principal_id=None, action=action, data=data)
