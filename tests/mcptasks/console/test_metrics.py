"""``GET /metrics``: Prometheus text with the Redis pool gauges; the token, or loopback in DEBUG only."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.support.requirements import require_redis

pytestmark = pytest.mark.django_db


def test_metrics_from_loopback_lists_the_redis_pools(settings: Any) -> None:
    settings.DEBUG = True  # without a token, loopback is enough only in DEBUG
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": ""}
    resp = Client(REMOTE_ADDR="127.0.0.1").get("/metrics")
    assert resp.status_code == 200
    text = resp.content.decode()
    assert 'mcptasks_redis_pool_max_connections{pool="counters"}' in text
    assert "mcptasks_redis_breaker_open" in text


def test_metrics_refuse_other_addresses_without_token(settings: Any) -> None:
    settings.DEBUG = True
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": ""}
    assert Client(REMOTE_ADDR="203.0.113.9").get("/metrics").status_code == 403


def test_metrics_token_is_required_when_set(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": "s3cret-metrics"}
    client = Client(REMOTE_ADDR="127.0.0.1")
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics").status_code == 200


def test_metrics_report_every_connection_pool(settings: Any) -> None:
    """Each Redis and PostgreSQL pool of the process, with its bound (only the sync Redis pool was)."""
    import asyncio

    from tenants import kv

    require_redis()
    settings.DEBUG = True  # without a token, loopback is enough only in DEBUG
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": "", "WRITE_THREADS": 4, "SYNC_THREADS": 8}
    kv.reset()

    async def use_async_counters() -> None:
        assert await kv.acall(lambda r: r.ping(), fallback=lambda store: False) is True
        # Scraped while this loop's client is alive: its connection counts.
        text = Client(REMOTE_ADDR="127.0.0.1").get("/metrics").content.decode()
        assert 'mcptasks_redis_pool_open_connections{pool="counters_async"} 1.0' in text

    try:
        asyncio.run(use_async_counters())
    finally:
        kv.reset()
    text = Client(REMOTE_ADDR="127.0.0.1").get("/metrics").content.decode()
    for pool in ("counters", "counters_async", "channel_layer"):
        assert f'mcptasks_redis_pool_max_connections{{pool="{pool}"}}' in text
    for pool, setting_value in (("write_threads", "4.0"), ("sync_threads", "8.0")):
        assert f'mcptasks_db_pool_max_connections{{pool="{pool}"}} {setting_value}' in text
    # This (test) thread's own Django connection is open and counted.
    assert 'mcptasks_db_connections_open{pool="other"}' in text


def test_default_executor_is_bounded_by_sync_threads(settings: Any) -> None:
    """ORM calls from async code that do not share the request thread run on a bounded pool."""
    import asyncio

    from mcptasks.processes.embedded import bound_default_executor

    settings.MCPTASKS = {**settings.MCPTASKS, "SYNC_THREADS": 3}

    async def main() -> tuple[int, set[str]]:
        loop = asyncio.get_running_loop()
        bound_default_executor(loop)
        names = await asyncio.gather(*(asyncio.to_thread(lambda: __import__("threading").current_thread().name)
                                       for _ in range(20)))
        return loop._default_executor._max_workers, set(names)  # type: ignore[attr-defined]

    workers, names = asyncio.run(main())
    assert workers == 3
    assert len(names) <= 3 and all(n.startswith("mcptasks-sync") for n in names), names


@pytest.mark.parametrize(
    ("group", "name", "value", "code"),
    [
        ("MCPTASKS", "REDIS_LAYER_POOL_SIZE", 100_000, "mcptasks.E005"),
        ("MCPTASKS", "SYNC_THREADS", 0, "mcptasks.E006"),
        ("MCPTASKS", "SYNC_THREADS", 1000, "mcptasks.E006"),
        ("MCPTASKS", "WRITE_THREADS", 1000, "mcptasks.E006"),
        ("TENANTS", "REDIS_POOL_SIZE", 0, "tenants.E012"),
        ("TENANTS", "REDIS_POOL_SIZE", 100_000, "tenants.E012"),
    ],
)
def test_pool_sizes_are_bounded_by_checks(settings: Any, group: str, name: str, value: int, code: str) -> None:
    from django.core import checks

    setattr(settings, group, {**getattr(settings, group), name: value})
    ids = [m.id for m in checks.run_checks() if m.level >= checks.ERROR]
    assert code in ids, ids
