"""Operator views in the Django admin: tasks, sessions, workers and the audit log.

Everything here is read-only except cancelling a task, which goes through the same service as
``tasks/cancel`` (and so the state machine, the runner's cancel signal and the audit trail).
Rows are limited to the operator's tenants (:mod:`tenants.roles`); the audit log can never be
edited or deleted from here, and exports as CSV with the list's current filters.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, StreamingHttpResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from tenants import roles
from tenants.admin import TENANT_FILTER, ScopedAuditedAdmin

from . import selectors, services
from .models import LIVE, AuditAnchor, AuditEvent, McpSession, Task, WorkerHeartbeat
from .protocol.errors import McpError


class ReadOnlyAdmin(ScopedAuditedAdmin):
    """Operators inspect; state changes go through the services (and so the audit log).

    Rows are scoped to the operator's tenants like every other admin of the project.
    """

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StatusLiveFilter(admin.SimpleListFilter):
    """Live (working or input_required) vs terminal, beside the exact status filter."""

    title = "lifecycle"
    parameter_name = "lifecycle"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("live", "live"), ("terminal", "terminal")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "live":
            return queryset.filter(status__in=LIVE)
        if self.value() == "terminal":
            return queryset.exclude(status__in=LIVE)
        return queryset


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ("task_id", "tenant", "principal", "tool_name", "status", "attempt", "worker_id",
                    "created_at", "finished_at")
    list_filter = (StatusLiveFilter, "status", TENANT_FILTER, "tool_name", "kind", "created_at")
    # Task id (exact or prefix), the principal's human name or its identifier, the tool.
    search_fields = ("=task_id", "^task_id", "principal__name", "principal__identifier", "tool_name")
    search_help_text = "Task id, principal name or identifier, tool name"
    list_select_related = ("tenant", "principal")
    ordering = ("-created_at",)
    date_hierarchy = "created_at"
    actions = ["cancel_tasks"]
    # Arguments and results may hold what a tool marked sensitive: shown on the task page only
    # to operators who can read it, never in the list.
    readonly_fields = ("task_id", "kind", "tenant", "principal", "tool_name", "status", "status_message",
                       "attempt", "max_attempts", "worker_id", "created_at", "last_updated_at", "finished_at",
                       "expires_at", "ttl_ms", "poll_interval_ms")
    exclude = ("params", "result", "error", "session")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """The ``cancel_task`` permission (superusers, tenant admins)."""
        return bool(request.user.has_perm("mcptasks.cancel_task"))

    @admin.action(description="Cancel selected tasks (as tasks/cancel, audited)", permissions=["cancel"])
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        """Cancel each live task the operator manages through :func:`services.cancel_task_as_operator`."""
        managed = roles.managed_tenant_ids(request.user)
        done, refused = 0, []
        for task in queryset.select_related("tenant", "principal"):
            if managed is not None and task.tenant_id not in managed:
                refused.append(f"{task.task_id}: not a tenant you manage")
                continue
            try:
                services.cancel_task_as_operator(operator=request.user, task=task)
                done += 1
            except McpError as exc:
                refused.append(f"{task.task_id}: {exc.message}")
        if done:
            self.message_user(request, f"Cancelled {done} task(s).", messages.SUCCESS)
        for line in refused[:20]:
            self.message_user(request, line, messages.WARNING)


@admin.register(McpSession)
class McpSessionAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant", "principal", "protocol_version", "created_at", "last_seen_at", "ended_at")
    list_filter = ("protocol_version", TENANT_FILTER)
    list_select_related = ("tenant", "principal")
    ordering = ("-last_seen_at",)


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    """Workers with their liveness and a link to the tasks each is running."""

    list_display = ("worker_id", "state", "hostname", "pid", "concurrency", "running_tasks", "last_seen_at",
                    "started_at")
    ordering = ("-last_seen_at",)

    def get_queryset(self, request: HttpRequest) -> Any:
        """Workers serve every tenant: only operators who see every tenant see them (hosts, pids)."""
        qs = admin.ModelAdmin.get_queryset(self, request)
        if roles.visible_tenant_ids(request.user) is not None:
            return qs.none()
        live = Task.objects.filter(worker_id=OuterRef("worker_id"), status__in=LIVE).order_by()
        count = live.values("worker_id").annotate(n=Count("pk")).values("n")[:1]
        return qs.annotate(live_tasks=Coalesce(Subquery(count), 0))

    @admin.display(description="state")
    def state(self, obj: WorkerHeartbeat) -> str:
        """alive, stopping or dead (no heartbeat within a lease)."""
        if not selectors.worker_is_alive(obj, now=timezone.now()):
            return "dead"
        return "stopping" if obj.stopping else "alive"

    @admin.display(description="running tasks")
    def running_tasks(self, obj: WorkerHeartbeat) -> str:
        """The live tasks leased to this worker, linked to the task list."""
        url = reverse("admin:mcptasks_task_changelist") + f"?worker_id={obj.worker_id}&lifecycle=live"
        return format_html('<a href="{}">{}</a>', url, getattr(obj, "live_tasks", obj.running))


class FlaggedFilter(admin.SimpleListFilter):
    """Events flagged by the suspicious-pattern detectors (``flag.*``)."""

    title = "flagged"
    parameter_name = "flagged"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "flagged only"), ("refusals", "refusals and failures")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(action__startswith="flag.")
        if self.value() == "refusals":
            return queryset.filter(action__in=selectors.REFUSAL_ACTIONS)
        return queryset


#: Columns of the CSV export (and of the audit API's CSV).
AUDIT_CSV_FIELDS = ("id", "created_at", "tenant", "principal", "action", "task_id", "data", "chain", "chain_seq",
                    "hash")


class _Echo:
    def write(self, value: str) -> str:
        return value


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """The audit log: newest first, filterable, exportable, never editable or deletable."""

    list_display = ("id", "created_at", "tenant", "principal", "action", "task_id", "summary", "sealed")
    list_filter = (FlaggedFilter, "action", TENANT_FILTER, "created_at")
    search_fields = ("=task_id", "action", "principal__name", "principal__identifier")
    search_help_text = "Task id, action, principal name or identifier"
    list_select_related = ("tenant", "principal")
    ordering = ("-id",)
    date_hierarchy = "created_at"
    readonly_fields = ("id", "created_at", "tenant", "principal", "action", "task_id", "data", "chain",
                       "chain_seq", "prev_hash", "hash", "sealed_at")
    exclude = ("principal_ref",)
    change_list_template = "admin/mcptasks/auditevent/change_list.html"

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # No bulk delete, whatever the permissions.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.display(description="details")
    def summary(self, obj: AuditEvent) -> str:
        """The event's data, shortened for the list."""
        text = ", ".join(f"{k}={v}" for k, v in sorted((obj.data or {}).items()) if k != "changes")
        return text if len(text) <= 120 else text[:120] + "…"

    @admin.display(boolean=True, description="sealed")
    def sealed(self, obj: AuditEvent) -> bool:
        """Whether the sealer has chained it yet."""
        return obj.chain_seq is not None

    def get_urls(self) -> list[Any]:
        urls = [path("export.csv", self.admin_site.admin_view(self.export_csv), name="mcptasks_auditevent_csv")]
        return urls + super().get_urls()

    def export_csv(self, request: HttpRequest) -> StreamingHttpResponse:
        """The list as CSV, with the filters and search of the page it was asked from."""
        if not self.has_view_permission(request):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        changelist = self.get_changelist_instance(request)
        rows = changelist.get_queryset(request).select_related("tenant", "principal").order_by("-id")
        writer = csv.writer(_Echo())

        def lines() -> Iterator[str]:
            yield writer.writerow(AUDIT_CSV_FIELDS)
            for ev in rows.iterator(chunk_size=2000):
                yield writer.writerow(audit_csv_row(ev))

        response = StreamingHttpResponse(lines(), content_type="text/csv")
        response["Content-Disposition"] = 'attachment; filename="audit-events.csv"'
        return response


def audit_csv_row(ev: AuditEvent) -> list[Any]:
    """One event as CSV cells (principal by name)."""
    import json

    return [ev.id, ev.created_at.isoformat(), ev.tenant.slug if ev.tenant else "", str(ev.principal or ""),
            ev.action, ev.task_id, json.dumps(ev.data, sort_keys=True), ev.chain, ev.chain_seq, ev.hash]


@admin.register(AuditAnchor)
class AuditAnchorAdmin(ReadOnlyAdmin):
    """Signed heads of the audit chains (export them with ``mcptasks_audit export-anchors``)."""

    tenant_field = "chain"
    list_display = ("chain", "kind", "seq", "head", "created_at")
    list_filter = ("kind",)
    ordering = ("-id",)

