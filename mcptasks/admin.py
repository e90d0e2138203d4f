"""Operator views in the Django admin: tasks, sessions, workers and the audit log (read-only)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import AuditEvent, McpSession, Task, WorkerHeartbeat


class ReadOnlyAdmin(admin.ModelAdmin):
    """Operators inspect; state changes go through the services (and so the audit log)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ("task_id", "kind", "tenant", "principal", "tool_name", "status", "attempt", "worker_id",
                    "created_at", "expires_at")
    list_filter = ("kind", "status", "tenant")
    search_fields = ("task_id", "tool_name", "worker_id")
    date_hierarchy = "created_at"


@admin.register(McpSession)
class McpSessionAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant", "principal", "protocol_version", "created_at", "last_seen_at", "ended_at")
    list_filter = ("protocol_version", "tenant")


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    list_display = ("worker_id", "hostname", "pid", "concurrency", "running", "last_seen_at", "stopping")


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "created_at", "tenant", "principal", "action", "task_id", "hash")
    list_filter = ("action", "tenant")
    search_fields = ("task_id", "action")
