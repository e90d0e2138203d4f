"""Issue 25 item 6: a tenant without a concurrency limit of its own is not unlimited.

A tenant whose ``max_concurrent_tasks`` is empty gets ``MCPTASKS_TASK_MAX_CONCURRENT`` (a
process-wide default applied when the tenant has none), so a fresh tenant cannot queue tasks
without bound; its own limit, larger or smaller, still wins; ``0`` restores "unlimited".
"""

from __future__ import annotations

from typing import Any

import pytest

from tenants import conf as tenant_conf
from tenants.exceptions import QuotaExceeded
from tenants.selectors import clear_limits_cache, effective_limits
from tests.support.factories import make_auth, make_session, make_task, make_tenant

pytestmark = pytest.mark.django_db


def _fill(auth: Any, n: int) -> int:
    """Create up to ``n`` tasks; how many were admitted before the first refusal."""
    session = make_session(auth)
    for i in range(n):
        try:
            make_task(auth, session)
        except QuotaExceeded:
            return i
    return n


def test_a_new_tenant_gets_the_default_concurrency_limit(settings: Any) -> None:
    tenant = make_tenant()
    assert tenant.max_concurrent_tasks is None
    assert effective_limits(tenant_id=tenant.pk).max_concurrent_tasks == 100
    assert tenant_conf.get().TASK_MAX_CONCURRENT == 100  # a sane, documented default
    settings.TENANTS = {**settings.TENANTS, "TASK_MAX_CONCURRENT": 3}
    clear_limits_cache()
    auth = make_auth(tenant)
    assert _fill(auth, 10) == 3
    with pytest.raises(QuotaExceeded) as refused:
        make_task(auth)
    assert refused.value.data == {"limit": 3, "scope": "tenant"}
    assert "limit 3" in str(refused.value)


def test_the_tenants_own_limit_wins_and_zero_means_unlimited(settings: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "TASK_MAX_CONCURRENT": 3}
    clear_limits_cache()
    assert _fill(make_auth(make_tenant(max_concurrent_tasks=5)), 10) == 5
    assert _fill(make_auth(make_tenant(max_concurrent_tasks=1)), 10) == 1
    settings.TENANTS = {**settings.TENANTS, "TASK_MAX_CONCURRENT": 0}
    clear_limits_cache()
    unlimited = make_tenant()
    assert _fill(make_auth(unlimited), 10) == 10
    assert effective_limits(tenant_id=unlimited.pk).max_concurrent_tasks is None
