"""The audit-review REST API (Django REST framework): a tenant's audit events, tasks and webhooks.

For auditors and tenant admins (:mod:`tenants.roles`), signed in (session), with HTTP Basic
credentials, or with an OAuth access token of the built-in authorization server carrying the
``audit:read`` scope (:class:`mcptasks.console.api_auth.AuditTokenAuthentication`; the token reads only
its application's tenant, and its operator must hold the role there).
``/api/tenants/<slug>/audit-events/`` and ``/api/tenants/<slug>/tasks/``: newest first,
cursor-paginated, filterable, JSON or CSV (``?format=csv`` streams every matching row, one column
per field); ``webhook-endpoints/`` and ``webhook-deliveries/`` likewise (never a signing secret
or a payload).
A tenant the caller may not see answers 404 exactly like one that does not exist. Task
arguments and results are never served here (a tool may have marked them sensitive).
OpenAPI at ``/api/schema/`` (drf-spectacular), browsable docs at ``/api/docs/`` with
locally served assets (drf-spectacular-sidecar).

Here: the views and their routes. Who may read (and the OpenAPI security schemes) is in
:mod:`.api_access`, the rows' fields in :mod:`.api_serializers`, filters and pages in
:mod:`.api_filters`, CSV in :mod:`.api_csv`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.http import Http404, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_view
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework import viewsets
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.routers import SimpleRouter
from rest_framework.settings import api_settings

from mcptasks.audit import trail as audit
from mcptasks.audit import watch
from mcptasks.console import api_auth, api_csv
from mcptasks.console.api_access import IsOperator, TokenScope, visible_tenants
from mcptasks.console.api_filters import TIME_FILTERS, NewestFirst, QueryFilter, TaskPages, filtered
from mcptasks.console.api_serializers import (
    AuditEventSerializer,
    TaskSerializer,
    WebhookDeliverySerializer,
    WebhookEndpointSerializer,
)
from mcptasks.db import config as dbconfig
from mcptasks.models import AuditEvent, Task, TaskStatus, WebhookDelivery
from tenants.models import Tenant, WebhookEndpoint

#: Query parameters recorded (truncated) in ``api.read``/``api.export`` events.
_AUDITED_PARAMS = ("since", "until", "principal", "action", "action_prefix", "task_id", "status", "tool", "format",
                   "page_size")

_View = TypeVar("_View", bound=type)


class TenantScopedViewSet(viewsets.ReadOnlyModelViewSet):
    """Rows of the tenant named in the URL, if the caller may see it (404 otherwise)."""

    renderer_classes = [JSONRenderer, api_csv.CSVRenderer]
    permission_classes = [IsAuthenticated, TokenScope]
    pagination_class = NewestFirst
    #: Rows are looked up by their numeric primary key unless a view says otherwise.
    lookup_value_regex = "[0-9]{1,18}"
    #: The list's query parameters, checked and applied in this order.
    query_filters: tuple[QueryFilter, ...] = ()
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

    def rows(self, tenant: Tenant) -> Any:
        """The tenant's rows, newest first (before the query's filters)."""
        raise NotImplementedError

    def get_queryset(self) -> Any:
        """:meth:`rows` of the URL's tenant narrowed by :attr:`query_filters`."""
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request, no tenant
            return self.get_serializer_class().Meta.model.objects.none()
        return filtered(self.rows(self.tenant()), self.request, self.query_filters)

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
        """Every row of ``qs`` as CSV (:func:`.api_csv.streamed`)."""
        serializer_class = self.get_serializer_class()
        context = self.get_serializer_context()
        # Keyset pages, not a server-side cursor (bounded memory, pooler-safe; every queryset
        # here is newest first by primary key).
        return api_csv.streamed(qs, dbconfig.newest_first_pages(qs),
                                serialize=lambda obj: serializer_class(obj, context=context).data,
                                fields=self.csv_fields, json_fields=self.csv_json_fields, filename=self.basename)


def _described(list_summary: str, retrieve_summary: str) -> Callable[[_View], _View]:
    """OpenAPI summaries of a viewset's two operations; the list's parameters are its ``query_filters``."""

    def decorate(view: _View) -> _View:
        parameters = [item.parameter() for item in getattr(view, "query_filters", ())]
        listing = extend_schema(summary=list_summary, parameters=parameters) if parameters else extend_schema(
            summary=list_summary)
        return extend_schema_view(list=listing, retrieve=extend_schema(summary=retrieve_summary))(view)

    return decorate


@_described("A tenant's audit events, newest first", "One audit event")
class AuditEventViewSet(TenantScopedViewSet):
    """Audit events of one tenant (its chain), for auditors and tenant admins."""

    serializer_class = AuditEventSerializer
    query_filters = (
        *TIME_FILTERS,
        QueryFilter("action", "action", description="Exact action, e.g. task.create."),
        QueryFilter("action_prefix", "action__startswith", description="Action prefix, e.g. flag. or admin."),
        QueryFilter("task_id", "task_id", description="Events about this task."),
    )
    csv_fields = ("id", "created_at", "tenant", "principal", "action", "task_id", "chain_seq", "hash", "data")
    csv_json_fields = ("data",)

    def rows(self, tenant: Tenant) -> Any:
        """The tenant's audit events (its chain)."""
        return AuditEvent.objects.filter(tenant=tenant).select_related("tenant", "principal").order_by("-id")


@_described("A tenant's tasks, newest first", "One task (by task id)")
class TaskViewSet(TenantScopedViewSet):
    """Tasks of one tenant (state only), for auditors and tenant admins."""

    serializer_class = TaskSerializer
    pagination_class = TaskPages
    query_filters = (
        *TIME_FILTERS,
        QueryFilter("status", "status", OpenApiTypes.STR, choices=TaskStatus.values),
        QueryFilter("tool", "tool_name", description="Tool name.", max_length=128),
    )
    lookup_field = "task_id"
    lookup_value_regex = "[A-Za-z0-9_-]{1,64}"
    csv_fields = ("task_id", "tenant", "principal", "tool_name", "status", "attempt", "created_at", "finished_at")

    def rows(self, tenant: Tenant) -> Any:
        """The tenant's tasks (not its other kinds of rows)."""
        return Task.objects.filter(tenant=tenant, kind=Task.Kind.TASK).select_related("tenant", "principal").order_by(
            "-seq")


@_described("A tenant's webhook endpoints", "One webhook endpoint")
class WebhookEndpointViewSet(TenantScopedViewSet):
    """Webhook endpoints of one tenant (read-only; managed in the console or with ``mcptasks_tenant webhook``)."""

    serializer_class = WebhookEndpointSerializer
    csv_fields = ("id", "tenant", "principal", "url", "events", "enabled", "disabled_reason")

    def rows(self, tenant: Tenant) -> Any:
        """The tenant's webhook endpoints."""
        return WebhookEndpoint.objects.filter(tenant=tenant).select_related("tenant", "principal").order_by("-id")


@_described("A tenant's webhook deliveries, newest first", "One webhook delivery")
class WebhookDeliveryViewSet(TenantScopedViewSet):
    """Webhook deliveries of one tenant: state, attempts, last error, next attempt."""

    serializer_class = WebhookDeliverySerializer
    query_filters = (
        QueryFilter("state", "state", choices=WebhookDelivery.State.values),
        QueryFilter("endpoint", "endpoint_id", OpenApiTypes.INT, "Only this endpoint's deliveries."),
        QueryFilter("task_id", "task_id", description="Only this task's deliveries."),
    )
    csv_fields = ("id", "msg_id", "endpoint", "task_id", "event", "state", "attempts", "last_error")

    def rows(self, tenant: Tenant) -> Any:
        """The tenant's webhook deliveries."""
        return WebhookDelivery.objects.filter(tenant=tenant).order_by("-id")


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
