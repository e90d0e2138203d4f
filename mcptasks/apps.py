from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate, post_save

from tenants.roles import AUDITOR_GROUP, TENANT_ADMIN_GROUP


class McpTasksConfig(AppConfig):
    """The MCP server: sessions, tasks, streams and the tool registry."""

    name = "mcptasks"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "MCP tasks"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from mcptasks import checks  # noqa: F401  (registers system checks)
        from mcptasks.console import admin  # noqa: F401  (the admin lives with the console)
        from tenants.signals import security_event

        security_event.connect(_audit_security_event, dispatch_uid="mcptasks.audit_security_event")
        post_migrate.connect(_operator_groups, sender=self, dispatch_uid="mcptasks.operator_groups")
        from django.contrib.admin.models import LogEntry

        post_save.connect(_audit_other_admin_change, sender=LogEntry, dispatch_uid="mcptasks.audit_log_entry")
        from django.db.backends.signals import connection_created

        from mcptasks.observability.metrics import track_db_connection

        connection_created.connect(track_db_connection, dispatch_uid="mcptasks.track_db_connection")

        # Tools, resources and prompts live in each installed app's tools.py, like admin.py.
        autodiscover_modules("tools")

        # Traces, when OTEL_TRACES_EXPORTER asks for them: before any connection or middleware
        # exists, in every process role (web, worker, serve).
        from mcptasks.observability import setup_tracing

        setup_tracing(_process_role())


def _process_role() -> str:
    """What this process is, for the traces' ``mcptasks.role`` resource attribute."""
    import sys

    command = sys.argv[1] if len(sys.argv) > 1 and sys.argv[0].endswith("manage.py") else ""
    return {"mcptasks_worker": "worker", "serve": "serve"}.get(command, "manage" if command else "web")


def _audit_security_event(*, action: str, tenant_id: int | None, data: dict[str, Any], **_: Any) -> None:
    """Record a security event of the tenants app (refused scopes, non-members, throttling)."""
    from mcptasks.audit import trail

    trail.append(tenant_id=tenant_id, principal_id=None, action=action, data=data)


#: This app's permissions for the operator groups of tenants/roles.py.
GROUP_PERMISSIONS: dict[str, tuple[str, ...]] = {
    AUDITOR_GROUP: ("view_task", "view_auditevent", "view_auditanchor", "view_mcpsession", "view_workerheartbeat",
                    "view_webhookdelivery"),
    TENANT_ADMIN_GROUP: ("view_task", "cancel_task", "view_auditevent", "view_mcpsession", "view_workerheartbeat",
                         "view_webhookdelivery", "redeliver_webhookdelivery"),
}


def _operator_groups(**_: Any) -> None:
    """Give the operator groups this app's permissions (after every migrate)."""
    from tenants.roles import grant_group_permissions

    grant_group_permissions("mcptasks", GROUP_PERMISSIONS)


def _audit_other_admin_change(*, instance: Any, created: bool, **_: Any) -> None:
    """Admin changes to models of other apps (users, groups, OAuth applications) into the audit trail.

    The two apps' own admins audit their changes in detail (before/after, per tenant); for the
    rest Django's admin log entry says who changed what (chain 0: no tenant).
    """
    from mcptasks.audit import trail

    if not created or instance.content_type is None or instance.content_type.app_label in ("tenants", "mcptasks"):
        return
    action = {1: "admin.add", 2: "admin.change", 3: "admin.delete"}.get(instance.action_flag, "admin.change")
    trail.append(tenant_id=None, principal_id=None, action=action, data={
        "operator": instance.user.get_username()[:150], "operator_id": instance.user_id,
        "model": f"{instance.content_type.app_label}.{instance.content_type.model}",
        "object_id": str(instance.object_id or "")[:64], "object": instance.object_repr[:200],
        "change_message": instance.get_change_message()[:500],
    })
