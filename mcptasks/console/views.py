"""Small Django views: the landing page, the bundled docs, liveness, readiness and metrics."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import re
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import DatabaseSyncToAsync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from prometheus_client import CONTENT_TYPE_LATEST

from mcptasks import conf
from mcptasks.console import dashboard, metrics
from mcptasks.db import write_pool as dbwrites
from mcptasks.streams import layers
from tenants import access, clientaddr, kv
from tenants import conf as tenant_conf
from tenants.models import Tenant

logger = logging.getLogger(__name__)

#: A documentation file name: the flat Markdown files of ``docs/`` and nothing else (no paths).
_DOC_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}\.md")


def mcp_url_for(request: HttpRequest) -> str:
    """The MCP endpoint's URL as a client should use it (``MCPTASKS_PUBLIC_URL`` when set)."""
    return tenant_conf.canonical_resource(request.build_absolute_uri(tenant_conf.get().MCP_PATH))


def landing(request: HttpRequest) -> TemplateResponse:
    """``/``: what this service is, its MCP URL, and links to the console, API docs and docs."""
    context = {"title": "mcptasks: MCP Tasks server", "mcp_url": mcp_url_for(request), "endpoint": False}
    return TemplateResponse(request, "mcptasks/landing.html", context)


def _docs_dir() -> Path:
    return Path(settings.BASE_DIR) / "docs"


def docs_index(request: HttpRequest) -> TemplateResponse:
    """``/docs/``: the Markdown files of the source tree's ``docs/`` folder (none if not deployed)."""
    folder = _docs_dir()
    names = sorted(p.name for p in folder.glob("*.md") if _DOC_NAME.fullmatch(p.name)) if folder.is_dir() else []
    return TemplateResponse(request, "mcptasks/docs_index.html", {"names": names})


def docs_page(request: HttpRequest, name: str) -> HttpResponse:
    """One file of ``docs/`` as plain text; any other name (paths included) is a 404."""
    path = _docs_dir() / name
    if not _DOC_NAME.fullmatch(name) or not path.is_file():
        raise Http404("No such document")
    return HttpResponse(path.read_bytes(), content_type="text/plain; charset=utf-8")


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


async def _probe_database() -> bool:
    """``SELECT 1`` within ``READY_TIMEOUT_S``, on a write thread when the process has them.

    Through the write pool, not a thread of its own: a process whose request-path writes are
    stuck or queued past the deadline cannot serve requests either, and is not ready.
    """
    pool = dbwrites.write_pool()
    probe: Any = (
        sync_to_async(_database_ok)
        if pool is None
        else DatabaseSyncToAsync(_database_ok, thread_sensitive=False, executor=pool)
    )
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            return bool(await probe())
    except TimeoutError:
        logger.warning("readiness: database did not answer within %.1f s", READY_TIMEOUT_S)
        return False


_layer_was_ok = True


async def _layer_ok() -> bool:
    """The channel layer answers: a write through its pool (Redis), else a message round trip.

    Tried twice within ``READY_TIMEOUT_S``: during a Redis failover one probe can meet the primary
    being demoted, which says nothing about the layer a moment later.
    A failure is logged once until the layer answers again (probes come every few seconds).
    """
    global _layer_was_ok
    layer = get_channel_layer()
    if layer is None:
        return False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_TIMEOUT_S
    failure: Exception | None = None
    for budget in (READY_TIMEOUT_S / 2, READY_TIMEOUT_S):
        remaining = min(budget, deadline - loop.time())
        if remaining <= 0:
            break
        try:
            async with asyncio.timeout(remaining):
                probe = getattr(layer, "probe", None)
                if probe is not None:
                    await probe()
                    ok = True
                else:
                    channel = await layer.new_channel("readyz.")
                    await layer.send(channel, {"type": "readyz.ping"})
                    ok = (await layer.receive(channel)).get("type") == "readyz.ping"
            if ok:
                _layer_was_ok = True
                return True
        except Exception as exc:
            failure = exc
    if _layer_was_ok:
        logger.warning("readiness: channel layer unreachable: %s", type(failure).__name__)
    _layer_was_ok = False
    return False


_counters_were_ok = True


async def _counters_ok() -> bool:
    """A PING to the Redis of the shared counters (True when there is none: in-process counters).

    A failure is logged once until a PING gets through again (probes come every few seconds).
    """
    global _counters_were_ok
    client = kv.aclient()
    if client is None:
        return True
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            await client.ping()
        _counters_were_ok = True
        return True
    except Exception as exc:
        if _counters_were_ok:
            logger.warning("readiness: Redis (counters) unreachable: %s", type(exc).__name__)
        _counters_were_ok = False
        return False


async def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: 503 only when the database does not answer; a Redis outage is ``degraded`` (200).

    Redis is an accelerator (streams and workers fall back to the database, counters to the
    process), so taking every web process out of rotation while it is away would turn a Redis
    failover into a full outage. See docs/operations.md.
    """
    db_ok, layer_ok, counters_ok = await asyncio.gather(_probe_database(), _layer_ok(), _counters_ok())
    redis_ok = layer_ok and counters_ok
    degraded = layers.record_redis_probe(redis_ok)
    status = "unavailable" if not db_ok else "degraded" if degraded else "ready"
    return JsonResponse(
        {
            "status": status,
            "database": db_ok,
            "channel_layer": layer_ok,
            "degraded": ["redis"] if degraded else [],
        },
        status=200 if db_ok else 503,
    )


def _metrics_allowed(request: HttpRequest) -> bool:
    token = conf.get().METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        return hmac.compare_digest(given.encode(), token.encode())
    if not settings.DEBUG:
        # Behind a same-host reverse proxy every request comes from loopback: outside DEBUG
        # only the token opens /metrics (check mcptasks.W005 warns when it is unset).
        return False
    try:
        return ipaddress.ip_address(clientaddr.from_request(request)).is_loopback
    except ValueError:
        return False


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus metrics: with ``MCPTASKS_METRICS_TOKEN`` as a bearer token; without one, only
    in DEBUG and only from a loopback client (the forwarded client behind a trusted proxy)."""
    if not _metrics_allowed(request):
        return JsonResponse({"error": "forbidden"}, status=403)
    return HttpResponse(metrics.render(), content_type=CONTENT_TYPE_LATEST)


def dashboard_view(request: HttpRequest) -> TemplateResponse | JsonResponse:
    """The operator dashboard (an admin page): per tenant, or every tenant the operator sees."""
    if not request.user.has_perm("mcptasks.view_task"):
        raise PermissionDenied
    visible = access.visible_tenant_ids(request.user)
    tenants = access.scope_queryset(Tenant.objects.all(), visible, field="pk")
    slug = request.GET.get("tenant", "")
    selected = tenants.filter(slug=slug).first() if slug else None
    scope = frozenset({selected.pk}) if selected is not None else visible
    board = dashboard.build(tenant_ids=scope)
    if request.GET.get("format") == "json":
        # What the page fetches to refresh itself (every MCPTASKS_DASHBOARD_REFRESH_S).
        return JsonResponse(board.chart_data())
    context = {
        **admin.site.each_context(request),
        "title": "Dashboard",
        "tenants": tenants,
        "selected": selected,
        "board": board,
        "chart_data": board.chart_data(),
        # Milliseconds for the page's timer; at least a second, whatever the setting says.
        "refresh_ms": int(max(1.0, conf.get().DASHBOARD_REFRESH_S) * 1000),
    }
    return TemplateResponse(request, "admin/mcptasks/dashboard.html", context)
