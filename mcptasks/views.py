"""Small Django views: health and metrics."""

from __future__ import annotations

import hmac
import ipaddress

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST

from . import conf, metrics


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness and database reachability."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        db_ok = True
    except Exception:
        db_ok = False
    return JsonResponse({"status": "ok" if db_ok else "degraded", "database": db_ok}, status=200 if db_ok else 503)


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
