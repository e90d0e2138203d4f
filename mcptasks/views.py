"""Small Django views: liveness, readiness and metrics."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from prometheus_client import CONTENT_TYPE_LATEST

from tenants import roles
from tenants.models import Tenant

from . import conf, dashboard, metrics

logger = logging.getLogger(__name__)

#: How long each readiness probe may take before its part counts as unreachable.
READY_TIMEOUT_S = 2.0


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process is up and answering (touches nothing else, so it never flaps)."""
    return JsonResponse({"status": "ok"})


def _database_ok() -> bool:
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        return True
    except Exception as exc:
        logger.warning("readiness: database unreachable: %s", type(exc).__name__)
        return False


async def _layer_ok() -> bool:
    """A message round trip through the channel layer (Redis in production)."""
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        channel = await layer.new_channel("readyz.")
        await asyncio.wait_for(layer.send(channel, {"type": "readyz.ping"}), READY_TIMEOUT_S)
        message = await asyncio.wait_for(layer.receive(channel), READY_TIMEOUT_S)
        return bool(message.get("type") == "readyz.ping")
    except Exception as exc:
        logger.warning("readiness: channel layer unreachable: %s", type(exc).__name__)
        return False


async def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: the database and the channel layer are reachable (503 otherwise)."""
    try:
        db_ok = await asyncio.wait_for(sync_to_async(_database_ok, thread_sensitive=False)(), READY_TIMEOUT_S)
    except TimeoutError:
        db_ok = False
    layer_ok = await _layer_ok()
    ready = db_ok and layer_ok
    return JsonResponse(
        {"status": "ready" if ready else "unavailable", "database": db_ok, "channel_layer": layer_ok},
        status=200 if ready else 503,
    )


def _metrics_allowed(request: HttpRequest) -> bool:
    token = conf.get().METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        return hmac.compare_digest(given.encode(), token.encode())
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus metrics: with ``MCPTASKS_METRICS_TOKEN`` as a bearer token, else loopback only."""
    if not _metrics_allowed(request):
        return JsonResponse({"error": "forbidden"}, status=403)
    return HttpResponse(metrics.render(), content_type=CONTENT_TYPE_LATEST)


def dashboard_view(request: HttpRequest) -> TemplateResponse:
    """The operator dashboard (an admin page): per tenant, or every tenant the operator sees."""
    if not request.user.has_perm("mcptasks.view_task"):
        raise PermissionDenied
    visible = roles.visible_tenant_ids(request.user)
    tenants = roles.scope_queryset(Tenant.objects.all(), visible, field="pk")
    slug = request.GET.get("tenant", "")
    selected = tenants.filter(slug=slug).first() if slug else None
    scope = frozenset({selected.pk}) if selected is not None else visible
    board = dashboard.build(tenant_ids=scope)
    context = {
        **admin.site.each_context(request),
        "title": "Dashboard",
        "tenants": tenants,
        "selected": selected,
        "board": board,
        "chart_data": board.chart_data(),
    }
    return TemplateResponse(request, "admin/mcptasks/dashboard.html", context)
