"""The process-wide counters client: one bounded pool, fail-open fallback, circuit breaker."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from tenants import kv
from tenants.auth import AuthContext
from tenants.models import Tenant
from tenants.ratelimit import RateLimited, check_rate, note_poll
from tenants.selectors import clear_limits_cache
from tests.support.requirements import require_redis
from tests.support.servers import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def dead_redis(settings: Any) -> str:
    """A REDIS_URL where nothing listens."""
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    kv.reset()
    return str(settings.REDIS_URL)


def _auth(tenant: Tenant) -> AuthContext:
    return AuthContext(tenant_id=tenant.pk, tenant_slug=tenant.slug, principal_id=1, principal_name="p")


def test_counting_fails_open_to_the_process_when_redis_is_down(
    tenant: Tenant, dead_redis: str, caplog: pytest.LogCaptureFixture
) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(rate_create_per_min=3)
    clear_limits_cache()
    caplog.set_level(logging.WARNING, logger="tenants.kv")
    t0 = time.monotonic()
    for _ in range(3):
        check_rate(auth=_auth(tenant), op_class="create")
    # Still enforced (by this process alone), never an error.
    with pytest.raises(RateLimited):
        check_rate(auth=_auth(tenant), op_class="create")
    assert time.monotonic() - t0 < 2.0
    warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warnings) == 1, "one warning per outage, not one per request"
    assert kv.breaker.is_open


def test_breaker_skips_redis_while_open(tenant: Tenant, dead_redis: str) -> None:
    calls = []

    def op(_client: Any) -> int:
        calls.append(1)
        raise OSError("refused")

    assert kv.call(op, fallback=lambda store: 7) == 7
    assert kv.call(op, fallback=lambda store: 8) == 8
    assert len(calls) == 1, "the open breaker must not try Redis again at once"


def test_tenant_without_limits_never_touches_redis(tenant: Tenant, dead_redis: str) -> None:
    for _ in range(5):
        check_rate(auth=_auth(tenant), op_class="read")
        note_poll(auth=_auth(tenant), task_id="x" * 64, poll_interval_ms=1000)
    assert not kv.breaker.is_open
    assert kv.pool_stats()["open"] == 0


def test_one_bounded_pool_per_process(settings: Any) -> None:
    require_redis()
    kv.reset()
    first = kv.client()
    assert kv.client() is first
    for _ in range(200):
        kv.call(lambda r: r.ping(), fallback=lambda store: None)
    stats = kv.pool_stats()
    assert 1 <= stats["open"] <= stats["max"] == settings.TENANTS.get("REDIS_POOL_SIZE", 20)


def test_local_store_is_bounded() -> None:
    store = kv.LocalStore(max_keys=10)
    for i in range(100):
        store.incr(f"k{i}", ttl_s=60)
    assert len(store._data) == 10
    assert store.get("k99") == 1 and store.get("k0") is None
