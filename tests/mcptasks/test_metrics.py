"""``GET /metrics``: Prometheus text with the Redis pool gauges, loopback or token only."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_metrics_from_loopback_lists_the_redis_pools(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": ""}
    resp = Client(REMOTE_ADDR="127.0.0.1").get("/metrics")
    assert resp.status_code == 200
    text = resp.content.decode()
    assert 'mcptasks_redis_pool_max_connections{pool="counters"}' in text
    assert "mcptasks_redis_breaker_open" in text


def test_metrics_refuse_other_addresses_without_token(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": ""}
    assert Client(REMOTE_ADDR="203.0.113.9").get("/metrics").status_code == 403


def test_metrics_token_is_required_when_set(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": "s3cret-metrics"}
    client = Client(REMOTE_ADDR="127.0.0.1")
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics").status_code == 200
