"""A tenant's cached limits: used for ``LIMITS_CACHE_S`` after their read, re-read ahead of their lapse."""

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


def test_fresh_then_due_then_lapsed(settings: Any, clock: list[float]) -> None:
    settings.TENANTS = {**settings.TENANTS, "LIMITS_CACHE_S": 1.0}
    tenant = Tenant.objects.create(slug="sel", name="sel", max_concurrent_tasks=3)
    assert usable_tenant_row(tenant_id=tenant.pk) is None
    assert tenant_row(tenant_id=tenant.pk).max_concurrent_tasks == 3
    assert usable_tenant_row(tenant_id=tenant.pk) == (TenantRow(max_concurrent_tasks=3), False)
    Tenant.objects.filter(pk=tenant.pk).update(max_concurrent_tasks=4)
    clock[0] += 0.8  # the last quarter: still the row read, due to be re-read
    assert usable_tenant_row(tenant_id=tenant.pk) == (TenantRow(max_concurrent_tasks=3), True)
    assert tenant_row(tenant_id=tenant.pk).max_concurrent_tasks == 3  # a plain reader uses it
    clock[0] += 0.2  # LIMITS_CACHE_S after the read: never used again
    assert usable_tenant_row(tenant_id=tenant.pk) is None
    assert tenant_row(tenant_id=tenant.pk).max_concurrent_tasks == 4
    assert usable_tenant_row(tenant_id=tenant.pk) == (TenantRow(max_concurrent_tasks=4), False)
    clock[0] += 0.8
    assert read_tenant_row(tenant_id=tenant.pk).max_concurrent_tasks == 4  # the re-read: fresh again
    assert usable_tenant_row(tenant_id=tenant.pk) == (TenantRow(max_concurrent_tasks=4), False)


def test_an_older_read_never_replaces_a_newer_one(settings: Any, clock: list[float]) -> None:
    settings.TENANTS = {**settings.TENANTS, "LIMITS_CACHE_S": 1.0}
    remember_tenant_row(tenant_id=7, row=TenantRow(max_concurrent_tasks=2), read_at=clock[0])
    remember_tenant_row(tenant_id=7, row=TenantRow(max_concurrent_tasks=1), read_at=clock[0] - 0.5)
    assert usable_tenant_row(tenant_id=7) == (TenantRow(max_concurrent_tasks=2), False)


def test_no_cache_when_the_setting_is_zero(settings: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "LIMITS_CACHE_S": 0}
    remember_tenant_row(tenant_id=8, row=TenantRow(), read_at=time.monotonic())
    assert usable_tenant_row(tenant_id=8) is None
