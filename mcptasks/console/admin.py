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
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
    StreamingHttpResponse,
)
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from mcptasks.console import operators, taskpage
from mcptasks.db import config as dbconfig
from mcptasks.models import LIVE, AuditAnchor, AuditEvent, McpSession, Task, WebhookDelivery, WorkerHeartbeat
from mcptasks.protocol.errors import McpError
from mcptasks.streams import webhooks
from mcptasks.tasks import selectors, transitions
from tenants import access
from tenants.admin import TENANT_FILTER, ScopedAuditedAdmin

# The admin is the service's operator console; "View site" leads to the landing page.
admin.site.site_header = "mcptasks console"
admin.site.site_title = "mcptasks console"
admin.site.index_title = "Tenants, tasks and audit"
admin.site.site_url = "/"


class ReadOnlyAdmin(ScopedAuditedAdmin):
    """Operators inspect; state changes go through the task engine (and so the audit log).

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
    list_display = ("task_id", "tenant", "principal", "tool_name", "status", "message", "duration", "attempt",
                    "worker_id", "created_at")
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
    exclude = ("params", "result", "error", "session", "progress")
    # The task page: arguments, progress, result or error, input requests, durations, cancel and a
    # live refresh (templates/admin/mcptasks/task/change_form.html).
    change_form_template = "admin/mcptasks/task/change_form.html"

    def get_list_display(self, request: HttpRequest) -> Any:
        """The worker column as an opaque label for tenant-scoped operators (see :mod:`.operators`)."""
        return _hide_worker(request, super().get_list_display(request))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """As :meth:`get_list_display`, on the task page."""
        return _hide_worker(request, super().get_readonly_fields(request, obj))

    def get_exclude(self, request: HttpRequest, obj: Any = None) -> Any:
        """The raw worker id is no form field of a tenant-scoped operator's task page either."""
        exclude = tuple(super().get_exclude(request, obj) or ())
        if access.visible_tenant_ids(request.user) is None:
            return exclude
        return (*exclude, "worker_id")

    @admin.display(description="worker")
    def worker(self, obj: Task) -> str:
        """An opaque label of the worker (its id names its host and pid)."""
        return operators.worker_label(obj.worker_id, all_tenants=False) or "-"

    @admin.display(description="status message")
    def message(self, obj: Task) -> str:
        """The status message, shortened for the list."""
        text = obj.status_message or ""
        return text if len(text) <= 60 else text[:60] + "…"

    @admin.display(description="duration")
    def duration(self, obj: Task) -> str:
        """Created to finished (or to now while it runs)."""
        return _seconds(taskpage.durations(obj, now=timezone.now())["total"])

    def get_urls(self) -> list[Any]:
        """The task page's live JSON, its cancel button and its downloads, beside the admin's URLs."""
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/live.json", view(self.live_view), name="mcptasks_task_live"),
            path("<path:object_id>/cancel/", view(self.cancel_view), name="mcptasks_task_cancel"),
            path("<path:object_id>/download/<str:part>.json", view(self.download_view),
                 name="mcptasks_task_download"),
            *super().get_urls(),
        ]

    def _visible_task(self, request: HttpRequest, object_id: str) -> Task:
        """The task if the operator may view it, else 404 (another tenant's task looks missing)."""
        obj = self.get_object(request, object_id) if self.has_view_permission(request) else None
        if obj is None:
            raise Http404
        return obj

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> Any:
        """The task page (see :mod:`.taskpage`), scoped like the list."""
        obj = self._visible_task(request, object_id)
        all_tenants = access.visible_tenant_ids(request.user) is None
        managed = access.managed_tenant_ids(request.user)
        context = {
            **(extra_context or {}),
            "task_page": taskpage.page(obj, all_tenants=all_tenants, now=timezone.now()),
            "live": taskpage.live(obj, all_tenants=all_tenants, now=timezone.now()),
            "can_cancel": (self.has_cancel_permission(request) and not obj.is_terminal
                           and (managed is None or obj.tenant_id in managed)),
        }
        return super().change_view(request, object_id, form_url, extra_context=context)

    def live_view(self, request: HttpRequest, object_id: str) -> JsonResponse:
        """What changes while the task runs, as JSON for the page's refresh (scoped like the page)."""
        obj = self._visible_task(request, object_id)
        all_tenants = access.visible_tenant_ids(request.user) is None
        response = JsonResponse(taskpage.live(obj, all_tenants=all_tenants, now=timezone.now()))
        response["Cache-Control"] = "no-store"
        return response

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: cancel this task through :meth:`cancel_tasks` (the audited admin action)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self._visible_task(request, object_id)
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        self.cancel_tasks(request, self.get_queryset(request).filter(pk=obj.pk))
        return HttpResponseRedirect(reverse("admin:mcptasks_task_change", args=[obj.pk]))

    def download_view(self, request: HttpRequest, object_id: str, part: str) -> HttpResponse:
        """The whole arguments, result or error as a JSON file (the page shows them capped)."""
        obj = self._visible_task(request, object_id)
        if part not in taskpage.PARTS:
            raise Http404
        response = HttpResponse(taskpage.full_json(obj, part), content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="{obj.task_id}-{part}.json"'
        response["X-Content-Type-Options"] = "nosniff"
        return response

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """The ``cancel_task`` permission (superusers, tenant admins)."""
        return bool(request.user.has_perm("mcptasks.cancel_task"))

    @admin.action(description="Cancel selected tasks (as tasks/cancel, audited)", permissions=["cancel"])
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        """Cancel each live task the operator manages through :func:`transitions.cancel_task_as_operator`."""
        managed = access.managed_tenant_ids(request.user)
        done, refused = 0, []
        for task in queryset.select_related("tenant", "principal"):
            if managed is not None and task.tenant_id not in managed:
                refused.append(f"{task.task_id}: not a tenant you manage")
                continue
            try:
                transitions.cancel_task_as_operator(operator=request.user, task=task)
                done += 1
            except McpError as exc:
                refused.append(f"{task.task_id}: {exc.message}")
        if done:
            self.message_user(request, f"Cancelled {done} task(s).", messages.SUCCESS)
        for line in refused[:20]:
            self.message_user(request, line, messages.WARNING)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _hide_worker(request: HttpRequest, fields: Any) -> Any:
    """``fields`` with ``worker_id`` replaced by ``worker`` unless the operator sees every tenant."""
    if access.visible_tenant_ids(request.user) is None:
        return fields
    return type(fields)("worker" if f == "worker_id" else f for f in fields)


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
        if access.visible_tenant_ids(request.user) is not None:
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


#: Columns of the CSV export before the event's ``data.<key>`` columns (one per key, see :mod:`.operators`).
AUDIT_CSV_FIELDS = ("id", "created_at", "tenant", "principal", "action", "task_id", "chain", "chain_seq", "hash")


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
        keys, other = operators.json_keys(rows, "data")

        def lines() -> Iterator[str]:
            yield writer.writerow(operators.csv_row([*AUDIT_CSV_FIELDS, *operators.flat_header("data", keys,
                                                                                              other=other)]))
            # Keyset pages, not a server-side cursor (bounded memory, pooler-safe).
            for ev in dbconfig.newest_first_pages(rows):
                cells = audit_csv_row(ev) + operators.flat_object(ev.data, keys, other=other)
                yield writer.writerow(operators.csv_row(cells))

        response = StreamingHttpResponse(lines(), content_type="text/csv")
        response["Content-Disposition"] = 'attachment; filename="audit-events.csv"'
        return response


def audit_csv_row(ev: AuditEvent) -> list[Any]:
    """One event's :data:`AUDIT_CSV_FIELDS` as CSV cells (principal by name)."""
    return [ev.id, ev.created_at.isoformat(), ev.tenant.slug if ev.tenant else "", str(ev.principal or ""),
            ev.action, ev.task_id, ev.chain, ev.chain_seq, ev.hash]


@admin.register(AuditAnchor)
class AuditAnchorAdmin(ReadOnlyAdmin):
    """Signed heads of the audit chains (export them with ``mcptasks_audit export-anchors``)."""

    tenant_field = "chain"
    list_display = ("chain", "kind", "seq", "head", "created_at")
    list_filter = ("kind",)
    ordering = ("-id",)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    """Deliveries per endpoint: state, attempts, last error, next attempt; redeliver (audited)."""

    list_display = ("event", "task_id", "endpoint", "state", "attempts", "last_status_code", "last_error",
                    "next_attempt_at", "created_at", "delivered_at")
    list_filter = ("state", TENANT_FILTER, "event")
    search_fields = ("=task_id", "=msg_id")
    search_help_text = "Task id or webhook-id"
    list_select_related = ("endpoint", "tenant")
    ordering = ("-id",)
    actions = ["redeliver"]
    # The payload may hold a tool's result: on the delivery's page only, never in the list.
    readonly_fields = ("msg_id", "endpoint", "tenant", "task_id", "event", "state", "attempts", "created_at",
                       "next_attempt_at", "lease_expires_at", "last_status_code", "last_error", "response_excerpt",
                       "delivered_at", "payload")
    exclude = ("worker_id",)

    def has_redeliver_permission(self, request: HttpRequest) -> bool:
        """The ``redeliver_webhookdelivery`` permission (superusers, tenant admins)."""
        return bool(request.user.has_perm("mcptasks.redeliver_webhookdelivery"))

    @admin.action(description="Redeliver selected (same webhook-id, audited)", permissions=["redeliver"])
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        """Queue the selected deliveries of tenants the operator manages again, now."""
        managed = access.managed_tenant_ids(request.user)
        rows = [d for d in queryset if managed is None or d.tenant_id in managed]
        n = webhooks.redeliver(deliveries=rows, operator=request.user)
        self.message_user(request, f"Queued {n} delivery(ies) again.", messages.SUCCESS)
