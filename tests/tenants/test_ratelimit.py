"""Per-tenant rate limits per operation class, and the pollInterval surcharge."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from mcptasks.endpoint.errors import answer
from tenants.auth import AuthContext
from tenants.models import Tenant
from tenants.ratelimit import RateLimited, check_rate, note_poll
from tenants.ratelimit.window import retry_after
from tenants.selectors import clear_limits_cache

pytestmark = pytest.mark.django_db

T0 = 1_700_000_040.0  # 0 s into a minute window (1_700_000_040 % 60 == 0)


@pytest.fixture
def auth(tenant: Tenant) -> AuthContext:
    return AuthContext(tenant_id=tenant.pk, tenant_slug=tenant.slug, principal_id=1, principal_name="p")


def _set(tenant: Tenant, **limits: Any) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(**limits)
    clear_limits_cache()


def test_unlimited_by_default(tenant: Tenant, auth: AuthContext) -> None:
    # No limit: far past any budget, nothing is refused and no counter is kept at all.
    with mock.patch("tenants.ratelimit.window.kv.call") as counters:
        for _ in range(500):
            for op_class in ("create", "read", "other"):
                check_rate(auth=auth, op_class=op_class)  # type: ignore[arg-type]
    counters.assert_not_called()
    # The same calls against a limit are counted and refused (so the loop above could fail).
    _set(tenant, rate_create_per_min=5)
    with pytest.raises(RateLimited):
        for _ in range(500):
            check_rate(auth=auth, op_class="create")


def test_limit_per_class(tenant: Tenant, auth: AuthContext) -> None:
    _set(tenant, rate_create_per_min=3, rate_read_per_min=None)
    with mock.patch("tenants.ratelimit.time.time", return_value=T0 + 10):
        for _ in range(3):
            check_rate(auth=auth, op_class="create")
        with pytest.raises(RateLimited) as info:
            check_rate(auth=auth, op_class="create")
        for _ in range(10):
            check_rate(auth=auth, op_class="read")  # other class unaffected
    err = info.value
    # 3 requests at 10 s: next window start + 20 s until 3 * (1 - s/60) + 1 <= 3.
    assert err.retry_after_s == 70 and err.limit == 3 and err.op_class == "create"
    # On the wire (the transport's error table): HTTP 429, Retry-After, JSON-RPC -32011.
    error, status, headers = answer(err)
    assert (status, headers) == (429, {"Retry-After": "70"})
    assert error.code == -32011
    assert error.data == {"limit": 3, "opClass": "create", "retryAfterS": 70, "windowS": 60}


def test_refused_requests_do_not_count_and_window_slides(tenant: Tenant, auth: AuthContext) -> None:
    _set(tenant, rate_other_per_min=4)
    with mock.patch("tenants.ratelimit.time.time", return_value=T0 + 59):
        for _ in range(4):
            check_rate(auth=auth, op_class="other")
        for _ in range(3):
            with pytest.raises(RateLimited):
                check_rate(auth=auth, op_class="other")
    # Next window, 30 s in: the previous 4 weigh 2 -> two more fit, not four.
    with mock.patch("tenants.ratelimit.time.time", return_value=T0 + 90):
        check_rate(auth=auth, op_class="other")
        check_rate(auth=auth, op_class="other")
        with pytest.raises(RateLimited) as info:
            check_rate(auth=auth, op_class="other")
    assert 1 <= info.value.retry_after_s <= 30


def test_tenants_are_separate(tenant: Tenant, auth: AuthContext) -> None:
    other = Tenant.objects.create(slug="other", rate_create_per_min=1)
    _set(tenant, rate_create_per_min=1)
    other_auth = AuthContext(tenant_id=other.pk, tenant_slug="other", principal_id=2, principal_name="q")
    check_rate(auth=auth, op_class="create")
    check_rate(auth=other_auth, op_class="create")
    with pytest.raises(RateLimited):
        check_rate(auth=auth, op_class="create")


def test_admin_edit_applies(tenant: Tenant, auth: AuthContext, settings: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "LIMITS_CACHE_S": 0}
    Tenant.objects.filter(pk=tenant.pk).update(rate_read_per_min=5)
    check_rate(auth=auth, op_class="read")
    Tenant.objects.filter(pk=tenant.pk).update(rate_read_per_min=1)
    with pytest.raises(RateLimited):
        check_rate(auth=auth, op_class="read")


def test_fast_polling_costs_an_extra_read(tenant: Tenant, auth: AuthContext) -> None:
    _set(tenant, rate_read_per_min=4)
    clock = [T0 + 1.0]
    with mock.patch("tenants.ratelimit.time.time", side_effect=lambda: clock[0]):
        # Polite client: one read per poll.
        for _ in range(2):
            check_rate(auth=auth, op_class="read")
            note_poll(auth=auth, task_id="t1", poll_interval_ms=1000)
            clock[0] += 1.5
        # Impatient client: the next poll comes 0.1 s later and pays twice (2 + 2 = 4).
        clock[0] = clock[0] - 1.5 + 0.1
        check_rate(auth=auth, op_class="read")
        note_poll(auth=auth, task_id="t1", poll_interval_ms=1000)
        # Budget of 4 used up after 3 polls.
        with pytest.raises(RateLimited):
            check_rate(auth=auth, op_class="read")


def test_fast_poll_over_budget_raises(tenant: Tenant, auth: AuthContext) -> None:
    _set(tenant, rate_read_per_min=1)
    with mock.patch("tenants.ratelimit.time.time", return_value=T0 + 5):
        check_rate(auth=auth, op_class="read")
        note_poll(auth=auth, task_id="t9", poll_interval_ms=5000)  # first poll: free
        with pytest.raises(RateLimited):
            note_poll(auth=auth, task_id="t9", poll_interval_ms=5000)


def test_retry_after_math() -> None:
    # Current window full: wait for the window end, then for this window's count to decay.
    assert retry_after(previous=0, current=3, limit=3, elapsed=10) == pytest.approx(50 + 20)
    # Only the previous window weighs: wait until its weight drops enough.
    assert retry_after(previous=10, current=0, limit=5, elapsed=0) == pytest.approx(36)


# --- the async path the MCP consumer takes (one Redis round trip per request) ---------------


def _acount(auth: AuthContext, op_class: str, polled: str | None = None, interval_ms: int = 1000) -> None:
    from asgiref.sync import async_to_sync

    from tenants.ratelimit import acount_request
    from tenants.selectors import tenant_row

    row = tenant_row(tenant_id=auth.tenant_id)
    async_to_sync(acount_request)(auth=auth, op_class=op_class, polled_task_id=polled,  # type: ignore[arg-type]
                                  poll_interval_ms=interval_ms, row=row)


def _use(redis: str, settings: Any) -> None:
    from tenants import kv

    if redis == "redis":
        from tests.support.requirements import require_redis

        require_redis()
    else:
        settings.REDIS_URL = ""
        kv.reset()


@pytest.mark.parametrize("redis", ["redis", "in-process"])
def test_async_counting_matches_the_sync_rules(tenant: Tenant, auth: AuthContext, settings: Any, redis: str) -> None:
    _use(redis, settings)
    _set(tenant, rate_other_per_min=3)
    with mock.patch("tenants.ratelimit.time.time", return_value=T0 + 1):
        for _ in range(3):
            _acount(auth, "other")
        with pytest.raises(RateLimited) as refused:
            _acount(auth, "other")
        assert refused.value.limit == 3 and refused.value.retry_after_s >= 1
        # Refused requests are not counted: the sync path sees exactly the three accepted ones.
        with pytest.raises(RateLimited):
            check_rate(auth=auth, op_class="other")
    # Unlimited classes cost nothing.
    with mock.patch("tenants.ratelimit.batch.kv.acall") as counters:
        _acount(auth, "create")
    counters.assert_not_called()


@pytest.mark.parametrize("redis", ["redis", "in-process"])
def test_async_polling_faster_than_poll_interval_costs_an_extra_read(
    tenant: Tenant, auth: AuthContext, settings: Any, redis: str
) -> None:
    _use(redis, settings)
    _set(tenant, rate_read_per_min=4)
    with mock.patch("tenants.ratelimit.time.time", return_value=T0 + 1):
        _acount(auth, "read", polled="task-1")  # 1 read
        _acount(auth, "read", polled="task-1")  # too soon: 2 more (3)
        _acount(auth, "read", polled="task-2")  # another task: 1 (4)
        with pytest.raises(RateLimited):
            _acount(auth, "read", polled="task-3")
    with mock.patch("tenants.ratelimit.time.time", return_value=T0 + 1 + 61 + 60):
        _acount(auth, "read", polled="task-1")  # a respectful poll later: one read
        _acount(auth, "read", polled="task-1", interval_ms=0)


def test_async_counting_is_one_round_trip(tenant: Tenant, auth: AuthContext) -> None:
    from tenants import kv

    _set(tenant, rate_read_per_min=100)
    real = kv.acall
    calls: list[int] = []

    async def counted(op: Any, *, fallback: Any) -> Any:
        calls.append(1)
        return await real(op, fallback=fallback)

    with mock.patch("tenants.ratelimit.batch.kv.acall", counted):
        _acount(auth, "read", polled="task-1")
        assert calls == [1]
        # A poll sooner than pollInterval is charged in the same round trip.
        _acount(auth, "read", polled="task-1")
    assert calls == [1, 1]


@pytest.mark.parametrize("redis", ["redis", "in-process"])
def test_async_early_poll_charge_that_does_not_fit_is_refused_and_uncounted(
    tenant: Tenant, auth: AuthContext, settings: Any, redis: str
) -> None:
    _use(redis, settings)
    _set(tenant, rate_read_per_min=2)
    with mock.patch("tenants.ratelimit.time.time", return_value=T0 + 1):
        _acount(auth, "read", polled="task-1")  # 1
        with pytest.raises(RateLimited):
            _acount(auth, "read", polled="task-1")  # 2, and the charge (3) does not fit
        # The poll itself counted, its refused charge did not: 2 of 2 used.
        with pytest.raises(RateLimited):
            check_rate(auth=auth, op_class="read")
    _set(tenant, rate_read_per_min=3)
    with mock.patch("tenants.ratelimit.time.time", return_value=T0 + 1):
        check_rate(auth=auth, op_class="read")  # the refused charge left room for exactly one more
        with pytest.raises(RateLimited):
            check_rate(auth=auth, op_class="read")


@pytest.mark.parametrize("redis", ["redis", "in-process"])
def test_concurrent_counts_share_round_trips_and_count_exactly(
    tenant: Tenant, auth: AuthContext, settings: Any, redis: str
) -> None:
    """Requests counted at the same time are batched into one script call, with the same outcome
    as counting them one by one: exactly ``limit`` accepted, refusals uncounted, early polls charged."""
    import asyncio

    from asgiref.sync import async_to_sync

    from tenants import kv
    from tenants.ratelimit import acount_request
    from tenants.selectors import tenant_row

    _use(redis, settings)
    _set(tenant, rate_read_per_min=10)
    row = tenant_row(tenant_id=auth.tenant_id)
    real, round_trips = kv.acall, []

    async def counted(op: Any, *, fallback: Any) -> Any:
        round_trips.append(1)
        return await real(op, fallback=fallback)

    async def one(polled: str) -> str:
        try:
            early = await acount_request(auth=auth, op_class="read", polled_task_id=polled, poll_interval_ms=1000,
                                         row=row)
        except RateLimited:
            return "refused"
        return "early" if early else "ok"

    async def burst() -> list[str]:
        # Six polls of six tasks, then the same six again (each too early: two reads each).
        first = await asyncio.gather(*(one(f"task-{i}") for i in range(6)))
        second = await asyncio.gather(*(one(f"task-{i}") for i in range(6)))
        return [*first, *second]

    with mock.patch("tenants.ratelimit.time.time", return_value=T0 + 1), \
            mock.patch("tenants.ratelimit.batch.kv.acall", counted):
        outcomes = async_to_sync(burst)()
    # 6 reads, then two early polls at 2 reads each (10); the rest refused, and not counted.
    assert outcomes[:6] == ["ok"] * 6
    assert outcomes[6:8] == ["early"] * 2 and outcomes[8:] == ["refused"] * 4
    # Two bursts of six: one script call each (plus one uncount per refusal).
    assert len(round_trips) == 2 + 4
    with mock.patch("tenants.ratelimit.time.time", return_value=T0 + 1), pytest.raises(RateLimited):
        check_rate(auth=auth, op_class="read")  # all 10 used: the refusals left nothing behind
