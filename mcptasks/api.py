"""The audit-review REST API (Django REST framework): a tenant's audit events, tasks and webhooks.

For auditors and tenant admins (:mod:`tenants.roles`), signed in (session), with HTTP Basic
credentials, or with an OAuth access token of the built-in authorization server carrying the
``audit:read`` scope (:class:`mcptasks.api_auth.AuditTokenAuthentication`; the token reads only
its application's tenant, and its operator must hold the role there).
``/api/tenants/<slug>/audit-events/`` and ``/api/tenants/<slug>/tasks/``: newest first,
cursor-paginated, filterable, JSON or CSV (``?format=csv`` streams every matching row, one column
per field); ``webhook-endpoints/`` and ``webhook-deliveries/`` likewise (never a signing secret
or a payload).
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
from drf_spectacular.authentication import BasicScheme
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, extend_schema_view
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework import serializers, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.routers import SimpleRouter
from rest_framework.settings import api_settings

from tenants import roles
from tenants.conf import AUDIT_READ_SCOPE
from tenants.models import Tenant, WebhookEndpoint

from . import api_auth, audit, dbconfig, operators, watch
from .models import AuditEvent, Task, TaskStatus, WebhookDelivery

#: Query parameters recorded (truncated) in ``api.read``/``api.export`` events.
_AUDITED_PARAMS = ("since", "until", "principal", "action", "action_prefix", "task_id", "status", "tool", "format",
                   "page_size")


class ThrottledBasicScheme(BasicScheme):
    """OpenAPI: the throttled HTTP Basic authentication is plain HTTP Basic to clients."""

    target_class = "mcptasks.api_auth.ThrottledBasicAuthentication"
    priority = 0


class AuditTokenScheme(OpenApiAuthenticationExtension):
    """OpenAPI: OAuth 2.0 bearer tokens of the built-in authorization server with ``audit:read``."""

    target_class = "mcptasks.api_auth.AuditTokenAuthentication"
    name = "oauth2"
    priority = 0

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        """Client credentials (an auditor's application) and authorization code + PKCE flows."""
        scopes = {AUDIT_READ_SCOPE: "Read the tenant's audit events and tasks"}
        return {
            "type": "oauth2",
            "description": "An access token from this server's authorization server (/o/token/) with the "
                           "audit:read scope, for an application of the tenant whose operator (the "
                           "resource owner, or the application's owner for client credentials) is its "
                           "auditor or tenant admin.",
            "flows": {
                "clientCredentials": {"tokenUrl": "/o/token/", "scopes": scopes},
                "authorizationCode": {"authorizationUrl": "/o/authorize/", "tokenUrl": "/o/token/",
                                      "scopes": scopes},
            },
        }

    def get_security_requirement(self, auto_schema: Any) -> dict[str, list[str]]:
        """Every operation needs ``audit:read``."""
        return {self.name: [AUDIT_READ_SCOPE]}


class TokenScope(BasePermission):
    """An OAuth token must carry ``audit:read`` (granted now); sessions and Basic pass through."""

    message = f"The access token lacks the {AUDIT_READ_SCOPE} scope."

    def has_permission(self, request: Request, view: Any) -> bool:
        """False (403) for a token without the scope."""
        return not api_auth.is_token(request.auth) or api_auth.token_has_audit_scope(request.auth)


def visible_tenants(request: Request) -> frozenset[int] | None:
    """Tenants the caller reads here: the operator's, and for a token only its application's."""
    visible = roles.visible_tenant_ids(request.user)
    if not api_auth.is_token(request.auth):
        return visible
    own = api_auth.token_tenant_id(request.auth)
    return frozenset({own}) if visible is None or own in visible else frozenset()


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
    worker_id = serializers.SerializerMethodField()

    @extend_schema_field(OpenApiTypes.STR)
    def get_worker_id(self, obj: Task) -> str:
        """The worker's id for operators of every tenant, else an opaque label (no host or pid)."""
        request = self.context.get("request")
        user = getattr(request, "user", None)
        all_tenants = user is not None and roles.visible_tenant_ids(user) is None
        return operators.worker_label(obj.worker_id, all_tenants=all_tenants)

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
    permission_classes = [IsAuthenticated, TokenScope]
    csv_fields: tuple[str, ...] = ()
    #: JSON fields of ``csv_fields`` flattened to a column per key.
    csv_json_fields: tuple[str, ...] = ()

    def tenant(self) -> Tenant:
        """The URL's tenant, visible to the caller, or 404 (same answer as a missing one)."""
        cached = getattr(self, "_tenant", None)
        if cached is not None:
            return cached
        slug = str(self.kwargs.get("tenant_slug", ""))
        visible = visible_tenants(self.request)
        tenant = Tenant.objects.filter(slug=slug).first() if len(slug) <= 64 else None
        if tenant is None or (visible is not None and tenant.pk not in visible):
            raise Http404
        self._tenant = tenant
        return tenant

    def audit_read(self, *, export: bool) -> None:
        """Record that the operator read (``api.read``) or exported (``api.export``) the tenant's
        rows, in its chain: once per operator and kind per ``AUDIT_REFUSAL_EVERY_S`` window (across
        processes; the rest counted in ``audit.suppressed``), as refusals are."""
        tenant, user = self.tenant(), self.request.user
        action = "api.export" if export else "api.read"
        if not watch.throttle.admit(action, f"u{user.pk}", tenant_id=tenant.pk):
            return
        query = {name: str(self.request.query_params.get(name))[:64] for name in _AUDITED_PARAMS
                 if self.request.query_params.get(name) not in (None, "")}
        data = {"operator": user.get_username()[:150], "resource": self.basename,
                "object": str(self.kwargs.get(self.lookup_url_kwarg or self.lookup_field, ""))[:64],
                "query": query}
        if api_auth.is_token(self.request.auth):
            # Which application's token read it (never the token itself).
            data["client_id"] = str(self.request.auth.application.client_id)[:100]
        audit.append(tenant_id=tenant.pk, principal_id=None, action=action, data=data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """One row (audited as a read)."""
        response = super().retrieve(request, *args, **kwargs)
        self.audit_read(export=False)
        return response

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
            response = self._csv(self.filter_queryset(self.get_queryset()))
            self.audit_read(export=True)
            return response
        response = super().list(request, *args, **kwargs)
        self.audit_read(export=False)
        return response

    def _csv(self, qs: Any) -> StreamingHttpResponse:
        """Every row, one column per field: the principal as ``principal.id``/``principal.name``,
        each key of an event's ``data`` its own ``data.<key>`` column (see :mod:`.operators`)."""
        writer = csv.writer(_Lines())
        serializer_class = self.get_serializer_class()
        context = self.get_serializer_context()
        fields = self.csv_fields
        objects: dict[str, tuple[list[str], bool]] = {"principal": (["id", "name"], False)}
        for name in self.csv_json_fields:
            objects[name] = operators.json_keys(qs, name)
        header: list[str] = []
        for f in fields:
            header += operators.flat_header(f, *objects[f][:1], other=objects[f][1]) if f in objects else [f]

        def rows() -> Iterator[str]:
            yield writer.writerow(operators.csv_row(header))
            # Keyset pages, not a server-side cursor (bounded memory, pooler-safe; both
            # querysets are newest first by primary key).
            for obj in dbconfig.newest_first_pages(qs):
                data = serializer_class(obj, context=context).data
                cells: list[Any] = []
                for f in fields:
                    if f in objects:
                        keys, other = objects[f]
                        cells += operators.flat_object(data[f], keys, other=other)
                    else:
                        cells.append(operators.flat_cell(data[f]))
                # Names come from OAuth clients and identity providers: no formula cells.
                yield writer.writerow(operators.csv_row(cells))

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
    csv_fields = ("id", "created_at", "tenant", "principal", "action", "task_id", "chain_seq", "hash", "data")
    csv_json_fields = ("data",)
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


class WebhookEndpointSerializer(serializers.ModelSerializer):
    """A webhook endpoint (never its signing secrets)."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    principal = PrincipalField(read_only=True)

    class Meta:
        model = WebhookEndpoint
        fields = ("id", "tenant", "principal", "url", "events", "enabled", "created_at", "last_success_at",
                  "failing_since", "disabled_reason", "previous_secret_expires_at")


class WebhookDeliverySerializer(serializers.ModelSerializer):
    """One webhook delivery's state (never its payload, which may hold a tool's result)."""

    class Meta:
        model = WebhookDelivery
        fields = ("id", "msg_id", "endpoint", "task_id", "event", "state", "attempts", "created_at",
                  "next_attempt_at", "last_status_code", "last_error", "delivered_at")


@extend_schema_view(list=extend_schema(summary="A tenant's webhook endpoints"),
                    retrieve=extend_schema(summary="One webhook endpoint"))
class WebhookEndpointViewSet(TenantScopedViewSet):
    """Webhook endpoints of one tenant (read-only; managed in the console or with ``mcptasks_tenant webhook``)."""

    serializer_class = WebhookEndpointSerializer
    pagination_class = NewestFirst
    csv_fields = ("id", "tenant", "principal", "url", "events", "enabled", "disabled_reason")
    lookup_value_regex = "[0-9]{1,18}"

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return WebhookEndpoint.objects.none()
        return WebhookEndpoint.objects.filter(tenant=self.tenant()).select_related("tenant", "principal").order_by(
            "-id")


@extend_schema_view(
    list=extend_schema(summary="A tenant's webhook deliveries, newest first", parameters=[
        OpenApiParameter("state", OpenApiTypes.STR, enum=list(WebhookDelivery.State.values)),
        OpenApiParameter("endpoint", OpenApiTypes.INT, description="Only this endpoint's deliveries."),
        OpenApiParameter("task_id", OpenApiTypes.STR, description="Only this task's deliveries."),
    ]),
    retrieve=extend_schema(summary="One webhook delivery"),
)
class WebhookDeliveryViewSet(TenantScopedViewSet):
    """Webhook deliveries of one tenant: state, attempts, last error, next attempt."""

    serializer_class = WebhookDeliverySerializer
    pagination_class = NewestFirst
    csv_fields = ("id", "msg_id", "endpoint", "task_id", "event", "state", "attempts", "last_error")
    lookup_value_regex = "[0-9]{1,18}"

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return WebhookDelivery.objects.none()
        qs = WebhookDelivery.objects.filter(tenant=self.tenant())
        state = _short(self.request, "state")
        if state is not None:
            if state not in WebhookDelivery.State.values:
                raise ValidationError({"state": f"One of {', '.join(WebhookDelivery.State.values)}."})
            qs = qs.filter(state=state)
        endpoint = _int(self.request, "endpoint")
        if endpoint is not None:
            qs = qs.filter(endpoint_id=endpoint)
        task_id = _short(self.request, "task_id")
        if task_id is not None:
            qs = qs.filter(task_id=task_id)
        return qs.order_by("-id")


class IsOperator(BasePermission):
    """Signed in, and an operator of at least one tenant (auditor, tenant admin, or every tenant)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        """Whether the caller may read the API's schema and docs."""
        user = request.user
        return bool(user and user.is_authenticated and visible_tenants(request) != frozenset())


class SchemaView(SpectacularAPIView):
    """The OpenAPI schema, for operators only (it maps the API for an attacker too)."""

    authentication_classes = api_settings.DEFAULT_AUTHENTICATION_CLASSES
    permission_classes = [IsOperator, TokenScope]


class DocsView(SpectacularSwaggerView):
    """Swagger UI, for operators only."""

    authentication_classes = api_settings.DEFAULT_AUTHENTICATION_CLASSES
    permission_classes = [IsOperator, TokenScope]


router = SimpleRouter()
router.register(r"tenants/(?P<tenant_slug>[-a-zA-Z0-9_]{1,64})/audit-events", AuditEventViewSet,
                basename="audit-events")
router.register(r"tenants/(?P<tenant_slug>[-a-zA-Z0-9_]{1,64})/tasks", TaskViewSet, basename="tasks")
router.register(r"tenants/(?P<tenant_slug>[-a-zA-Z0-9_]{1,64})/webhook-endpoints", WebhookEndpointViewSet,
                basename="webhook-endpoints")
router.register(r"tenants/(?P<tenant_slug>[-a-zA-Z0-9_]{1,64})/webhook-deliveries", WebhookDeliveryViewSet,
                basename="webhook-deliveries")
