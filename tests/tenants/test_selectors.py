"""A tenant's cached limits: fresh for ``LIMITS_CACHE_S``, then usable for one more while re-read."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tenants import selectors
from tenants.models import Tenant
from tenants.selectors import TenantRow, read_tenant_row, remember_tenant_row, tenant_row, usable_tenant_row

pytestmark = [pytest.mark.django_db]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(selectors.time, "monotonic", lambda: now[0])
    return now


def test_fresh_then_lapsed_then_gone(settings: Any, clock: list[float]) -> None:
    settings.TENANTS = {**settings.TENANTS, "LIMITS_CACHE_S": 1.0}
    tenant = Tenant.objects.create(slug="sel", name="sel", max_concurrent_tasks=3)
    assert usable_tenant_row(tenant_id=tenant.pk) is None
    assert tenant_row(tenant_id=tenant.pk).max_concurrent_tasks == 3
    assert usable_tenant_row(tenant_id=tenant.pk) == (TenantRow(max_concurrent_tasks=3), True)
    Tenant.objects.filter(pk=tenant.pk).update(max_concurrent_tasks=4)
    clock[0] += 1.5  # past LIMITS_CACHE_S: still the old row, marked lapsed
    assert usable_tenant_row(tenant_id=tenant.pk) == (TenantRow(max_concurrent_tasks=3), False)
    assert selectors.cached_tenant_row(tenant_id=tenant.pk) is None  # a fresh-only reader re-reads
    clock[0] += 0.6  # past twice LIMITS_CACHE_S: not usable at all
    assert usable_tenant_row(tenant_id=tenant.pk) is None
    assert read_tenant_row(tenant_id=tenant.pk).max_concurrent_tasks == 4
    assert usable_tenant_row(tenant_id=tenant.pk) == (TenantRow(max_concurrent_tasks=4), True)


def test_an_older_read_never_replaces_a_newer_one(settings: Any, clock: list[float]) -> None:
    settings.TENANTS = {**settings.TENANTS, "LIMITS_CACHE_S": 1.0}
    remember_tenant_row(tenant_id=7, row=TenantRow(max_concurrent_tasks=2), read_at=clock[0])
    remember_tenant_row(tenant_id=7, row=TenantRow(max_concurrent_tasks=1), read_at=clock[0] - 0.5)
    assert usable_tenant_row(tenant_id=7) == (TenantRow(max_concurrent_tasks=2), True)


def test_no_cache_when_the_setting_is_zero(settings: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "LIMITS_CACHE_S": 0}
    remember_tenant_row(tenant_id=8, row=TenantRow(), read_at=time.monotonic())
    assert usable_tenant_row(tenant_id=8) is None
