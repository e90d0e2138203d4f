"""The audit-review REST API (Django REST framework): a tenant's audit events and tasks.

For auditors and tenant admins (:mod:`tenants.roles`), signed in (session) or with HTTP Basic
credentials. ``/api/tenants/<slug>/audit-events/`` and ``/api/tenants/<slug>/tasks/``: newest
first, cursor-paginated, filterable, JSON or CSV (``?format=csv`` streams every matching row).
A tenant the caller may not see answers 404 exactly like one that does not exist. Task
arguments and results are never served here (a tool may have marked them sensitive).
OpenAPI at ``/api/schema/`` (drf-spectacular), browsable docs at ``/api/docs/`` with
locally served assets (drf-spectacular-sidecar).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

from django.http import Http404, StreamingHttpResponse
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.routers import SimpleRouter

from tenants import roles
from tenants.models import Tenant

from .models import AuditEvent, Task, TaskStatus


class CSVRenderer(BaseRenderer):
    """Declares ``text/csv`` (the views stream the rows themselves)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        """Errors (the only thing rendered through here) as one CSV cell."""
        buf: list[str] = []
        writer = csv.writer(_Lines(buf))
        writer.writerow(["error"])
        writer.writerow([json.dumps(data)])
        return "".join(buf).encode()


class _Lines:
    def __init__(self, buf: list[str] | None = None) -> None:
        self.buf = buf

    def write(self, value: str) -> str:
        if self.buf is not None:
            self.buf.append(value)
        return value


class NewestFirst(CursorPagination):
    """Opaque cursors, newest first; ``page_size`` up to 1000."""

    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000
    ordering = "-id"


class TaskPages(NewestFirst):
    ordering = "-seq"


@extend_schema_field({"type": "object", "nullable": True, "readOnly": True,
                      "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}})
class PrincipalField(serializers.Field):
    """A principal as ``{"id", "name"}`` (its human name, else its identifier)."""

    def to_representation(self, value: Any) -> dict[str, Any]:
        return {"id": value.pk, "name": value.name or value.identifier}


class AuditEventSerializer(serializers.ModelSerializer):
    """One audit event with its place in the tenant's chain."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    principal = PrincipalField(read_only=True)

    class Meta:
        model = AuditEvent
        fields = ("id", "created_at", "tenant", "principal", "action", "task_id", "data", "chain", "chain_seq",
                  "prev_hash", "hash", "sealed_at")


class TaskSerializer(serializers.ModelSerializer):
    """A task's state (never its arguments or result)."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    principal = PrincipalField(read_only=True)

    class Meta:
        model = Task
        fields = ("task_id", "tenant", "principal", "tool_name", "status", "status_message", "attempt", "worker_id",
                  "created_at", "last_updated_at", "finished_at", "expires_at", "ttl_ms")


_TIME_PARAMS = [
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="Only rows created at or after this time."),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="Only rows created before this time."),
    OpenApiParameter("principal", OpenApiTypes.INT, description="Only this principal's rows (its id)."),
]


def _time(request: Request, name: str) -> dt.datetime | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = parse_datetime(raw)
    except ValueError:
        value = None
    try:
        # In UTC: PostgreSQL refuses offsets beyond +-15:59 that Python accepts (found by schemathesis).
        return value.astimezone(dt.UTC) if value is not None and value.tzinfo is not None else _bad_time(name)
    except (OverflowError, ValueError):
        return _bad_time(name)


def _bad_time(name: str) -> dt.datetime:
    raise ValidationError({name: "An ISO 8601 date-time with a UTC offset, e.g. 2026-01-01T00:00:00Z."})


def _int(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise ValidationError({name: "A positive integer."})
    return int(raw)


def _short(request: Request, name: str, limit: int = 64) -> str | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if len(raw) > limit or "\x00" in raw:
        raise ValidationError({name: f"At most {limit} characters."})
    return raw


class TenantScopedViewSet(viewsets.ReadOnlyModelViewSet):
    """Rows of the tenant named in the URL, if the caller may see it (404 otherwise)."""

    renderer_classes = [JSONRenderer, CSVRenderer]
    csv_fields: tuple[str, ...] = ()

    def tenant(self) -> Tenant:
        """The URL's tenant, visible to the caller, or 404 (same answer as a missing one)."""
        slug = str(self.kwargs.get("tenant_slug", ""))
        visible = roles.visible_tenant_ids(self.request.user)
        tenant = Tenant.objects.filter(slug=slug).first() if len(slug) <= 64 else None
        if tenant is None or (visible is not None and tenant.pk not in visible):
            raise Http404
        return tenant

    def filtered(self, qs: Any) -> Any:
        """The common filters: time window and principal."""
        since, until, principal = _time(self.request, "since"), _time(self.request, "until"), _int(
            self.request, "principal")
        if since is not None:
            qs = qs.filter(created_at__gte=since)
        if until is not None:
            qs = qs.filter(created_at__lt=until)
        if principal is not None:
            qs = qs.filter(principal_id=principal)
        return qs

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """A page (JSON), or every matching row streamed (CSV)."""
        if getattr(request.accepted_renderer, "format", "") == "csv":
            return self._csv(self.filter_queryset(self.get_queryset()))
        return super().list(request, *args, **kwargs)

    def _csv(self, qs: Any) -> StreamingHttpResponse:
        writer = csv.writer(_Lines())
        serializer_class = self.get_serializer_class()
        fields = self.csv_fields

        def rows() -> Iterator[str]:
            yield writer.writerow(fields)
            for obj in qs.iterator(chunk_size=2000):
                data = serializer_class(obj).data
                yield writer.writerow([
                    json.dumps(data[f], sort_keys=True) if isinstance(data[f], dict | list) else data[f]
                    for f in fields
                ])

        response = StreamingHttpResponse(rows(), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{self.basename}.csv"'
        return response


@extend_schema_view(
    list=extend_schema(
        summary="A tenant's audit events, newest first",
        parameters=[
            *_TIME_PARAMS,
            OpenApiParameter("action", OpenApiTypes.STR, description="Exact action, e.g. task.create."),
            OpenApiParameter("action_prefix", OpenApiTypes.STR, description="Action prefix, e.g. flag. or admin."),
            OpenApiParameter("task_id", OpenApiTypes.STR, description="Events about this task."),
        ],
    ),
    retrieve=extend_schema(summary="One audit event"),
)
class AuditEventViewSet(TenantScopedViewSet):
    """Audit events of one tenant (its chain), for auditors and tenant admins."""

    serializer_class = AuditEventSerializer
    pagination_class = NewestFirst
    csv_fields = ("id", "created_at", "tenant", "principal", "action", "task_id", "data", "chain_seq", "hash")
    lookup_value_regex = "[0-9]{1,18}"

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request, no tenant
            return AuditEvent.objects.none()
        tenant = self.tenant()
        qs = self.filtered(AuditEvent.objects.filter(tenant=tenant).select_related("tenant", "principal"))
        for name, lookup in (("action", "action"), ("action_prefix", "action__startswith"), ("task_id", "task_id")):
            value = _short(self.request, name)
            if value is not None:
                qs = qs.filter(**{lookup: value})
        return qs.order_by("-id")


@extend_schema_view(
    list=extend_schema(
        summary="A tenant's tasks, newest first",
        parameters=[
            *_TIME_PARAMS,
            OpenApiParameter("status", OpenApiTypes.STR, enum=[s.value for s in TaskStatus]),
            OpenApiParameter("tool", OpenApiTypes.STR, description="Tool name."),
        ],
    ),
    retrieve=extend_schema(summary="One task (by task id)"),
)
class TaskViewSet(TenantScopedViewSet):
    """Tasks of one tenant (state only), for auditors and tenant admins."""

    serializer_class = TaskSerializer
    pagination_class = TaskPages
    lookup_field = "task_id"
    lookup_value_regex = "[A-Za-z0-9_-]{1,64}"
    csv_fields = ("task_id", "tenant", "principal", "tool_name", "status", "attempt", "created_at", "finished_at")

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request, no tenant
            return Task.objects.none()
        tenant = self.tenant()
        qs = self.filtered(Task.objects.filter(tenant=tenant, kind=Task.Kind.TASK).select_related("tenant",
                                                                                                    "principal"))
        status = _short(self.request, "status")
        if status is not None:
            if status not in TaskStatus.values:
                raise ValidationError({"status": f"One of {', '.join(TaskStatus.values)}."})
            qs = qs.filter(status=status)
        tool = _short(self.request, "tool", 128)
        if tool is not None:
            qs = qs.filter(tool_name=tool)
        return qs.order_by("-seq")



router = SimpleRouter()
router.register(r"tenants/(?P<tenant_slug>[-a-zA-Z0-9_]{1,64})/audit-events", AuditEventViewSet,
                basename="audit-events")
router.register(r"tenants/(?P<tenant_slug>[-a-zA-Z0-9_]{1,64})/tasks", TaskViewSet, basename="tasks")
