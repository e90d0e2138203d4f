"""Concurrency quotas: conditional UPDATEs on tenant and principal counters."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction

from mcptasks.endpoint.errors import answer
from tenants.models import Principal, Tenant
from tenants.quotas import QuotaExceeded, acquire_task_slot, release_task_slot
from tenants.selectors import clear_limits_cache, effective_limits
from tenants.services import get_or_create_principal
from tests.support.requirements import require_postgres
from tests.support.row_locks import counter_rows_held

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(tenant: Tenant) -> Principal:
    return get_or_create_principal(tenant=tenant, kind=Principal.Kind.USER, identifier="alice")


@pytest.fixture
def bob(tenant: Tenant) -> Principal:
    return get_or_create_principal(tenant=tenant, kind=Principal.Kind.USER, identifier="bob")


def _acquire(tenant: Tenant, principal: Principal) -> None:
    with transaction.atomic():
        acquire_task_slot(tenant_id=tenant.pk, principal_id=principal.pk)


def _counts(tenant: Tenant, *principals: Principal) -> tuple[int, ...]:
    tenant.refresh_from_db()
    values = [tenant.active_tasks]
    for p in principals:
        p.refresh_from_db()
        values.append(p.active_tasks)
    return tuple(values)


def test_unlimited_counts(tenant: Tenant, alice: Principal) -> None:
    for _ in range(3):
        _acquire(tenant, alice)
    assert _counts(tenant, alice) == (3, 3)


def test_tenant_limit(tenant: Tenant, alice: Principal, bob: Principal) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(max_concurrent_tasks=2)
    _acquire(tenant, alice)
    _acquire(tenant, bob)
    with pytest.raises(QuotaExceeded) as info:
        _acquire(tenant, alice)
    assert info.value.data == {"limit": 2, "scope": "tenant"}
    assert "limit 2" in info.value.message
    error, status, _ = answer(info.value)
    assert (error.code, status, error.data) == (-32010, 200, {"limit": 2, "scope": "tenant"})
    assert _counts(tenant, alice, bob) == (2, 1, 1)
    release_task_slot(tenant_id=tenant.pk, principal_id=alice.pk)
    _acquire(tenant, bob)
    assert _counts(tenant, alice, bob) == (2, 0, 2)


def test_principal_limit_rolls_back_tenant(tenant: Tenant, alice: Principal, bob: Principal) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(max_concurrent_tasks_per_principal=1)
    _acquire(tenant, alice)
    with pytest.raises(QuotaExceeded) as info:
        _acquire(tenant, alice)
    assert info.value.data == {"limit": 1, "scope": "principal"}
    # The tenant increment of the refused attempt was rolled back.
    assert _counts(tenant, alice) == (1, 1)
    _acquire(tenant, bob)
    assert _counts(tenant, alice, bob) == (2, 1, 1)


def test_caught_error_leaves_no_trace(tenant: Tenant, alice: Principal) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(max_concurrent_tasks_per_principal=0)
    with transaction.atomic():
        with pytest.raises(QuotaExceeded):
            acquire_task_slot(tenant_id=tenant.pk, principal_id=alice.pk)
        # The caller swallowed the error and commits: nothing was taken.
    assert _counts(tenant, alice) == (0, 0)


def test_failure_in_caller_rolls_back_slot(tenant: Tenant, alice: Principal) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        acquire_task_slot(tenant_id=tenant.pk, principal_id=alice.pk)
        raise RuntimeError("task insert failed")
    assert _counts(tenant, alice) == (0, 0)


def test_must_be_inside_atomic(tenant: Tenant, alice: Principal, settings: Any) -> None:
    # pytest-django wraps the test in a transaction; simulate a caller without one.
    conn = transaction.get_connection()
    saved = conn.in_atomic_block
    conn.in_atomic_block = False
    try:
        with pytest.raises(RuntimeError):
            acquire_task_slot(tenant_id=tenant.pk, principal_id=alice.pk)
    finally:
        conn.in_atomic_block = saved


def test_release_never_below_zero(tenant: Tenant, alice: Principal) -> None:
    release_task_slot(tenant_id=tenant.pk, principal_id=alice.pk)
    assert _counts(tenant, alice) == (0, 0)


def test_admin_edit_applies_immediately(tenant: Tenant, alice: Principal) -> None:
    _acquire(tenant, alice)
    Tenant.objects.filter(pk=tenant.pk).update(max_concurrent_tasks=1)
    with pytest.raises(QuotaExceeded):
        _acquire(tenant, alice)
    Tenant.objects.filter(pk=tenant.pk).update(max_concurrent_tasks=None)
    _acquire(tenant, alice)
    assert _counts(tenant, alice) == (2, 2)


def test_effective_limits(tenant: Tenant, settings: Any) -> None:
    settings.TENANTS = {
        **settings.TENANTS,
        "TASK_DEFAULT_TTL_MS": 60_000,
        "TASK_MAX_TTL_MS": 120_000,
        "TASK_POLL_INTERVAL_MS": 500,
    }
    limits = effective_limits(tenant_id=tenant.pk)
    assert (limits.default_ttl_ms, limits.max_ttl_ms, limits.poll_interval_ms) == (60_000, 120_000, 500)
    assert limits.max_concurrent_tasks == 100  # no limit of its own: MCPTASKS_TASK_MAX_CONCURRENT
    Tenant.objects.filter(pk=tenant.pk).update(
        default_ttl_ms=10_000, max_ttl_ms=5_000, poll_interval_ms=2_000, max_concurrent_tasks=7
    )
    clear_limits_cache()
    limits = effective_limits(tenant_id=tenant.pk)
    assert (limits.default_ttl_ms, limits.max_ttl_ms, limits.poll_interval_ms) == (5_000, 5_000, 2_000)
    assert limits.max_concurrent_tasks == 7


def test_limits_cache_is_short(tenant: Tenant, settings: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "LIMITS_CACHE_S": 0}
    assert effective_limits(tenant_id=tenant.pk).poll_interval_ms == 1000
    Tenant.objects.filter(pk=tenant.pk).update(poll_interval_ms=3000)
    assert effective_limits(tenant_id=tenant.pk).poll_interval_ms == 3000


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_acquire_on_postgres() -> None:
    if connection.vendor != "postgresql":
        require_postgres()
    tenant = Tenant.objects.create(slug="race", max_concurrent_tasks=5, max_concurrent_tasks_per_principal=3)
    principals = [
        Principal.objects.create(tenant=tenant, kind=Principal.Kind.USER, identifier=f"u{i}")
        for i in range(4)
    ]
    barrier = threading.Barrier(24)
    results: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        from django.db import connections

        principal = principals[i % len(principals)]
        try:
            barrier.wait()
            with transaction.atomic():
                acquire_task_slot(tenant_id=tenant.pk, principal_id=principal.pk)
            outcome = f"ok:{principal.pk}"
        except QuotaExceeded as exc:
            outcome = f"refused:{exc.data['scope']}"
        finally:
            connections.close_all()
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ok = [r for r in results if r.startswith("ok:")]
    assert len(results) == 24
    assert len(ok) == 5
    tenant.refresh_from_db()
    assert tenant.active_tasks == 5
    for p in principals:
        p.refresh_from_db()
        assert p.active_tasks == ok.count(f"ok:{p.pk}") <= 3


def _unlimited_by_default(settings: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "TASK_MAX_CONCURRENT": 0}


def _race_creations(auths: list[Any], *, threads: int = 20, each: int = 10) -> tuple[int, list[dict[str, Any]]]:
    """``threads`` x ``each`` task creations through the real service, started together."""
    from django.db import connections

    from mcptasks.tasks import creation
    from tests.support.factories import demo_tool, make_session

    sessions = [make_session(auths[i % len(auths)]) for i in range(threads)]
    barrier = threading.Barrier(threads)
    created: list[int] = []
    refused: list[dict[str, Any]] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        auth = auths[i % len(auths)]
        try:
            barrier.wait()
            for n in range(each):
                try:
                    creation.create_task(auth=auth, session=sessions[i], tool=demo_tool(), arguments={"ms": 1},
                                         request_id=f"r{i}-{n}", progress_token=None, requested_ttl_ms=None)
                    with lock:
                        created.append(i)
                except QuotaExceeded as exc:
                    with lock:
                        refused.append(exc.data)
        finally:
            connections.close_all()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(120)
    assert len(created) + len(refused) == threads * each
    return len(created), refused


def _live(tenant_id: int, principal_id: int | None = None) -> int:
    from mcptasks.models import Task

    rows = Task.objects.filter(tenant_id=tenant_id).exclude(status__in=["completed", "failed", "cancelled"])
    return rows.filter(principal_id=principal_id).count() if principal_id else rows.count()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_200_concurrent_creations_against_a_tenant_limit_of_10(settings: Any) -> None:
    if connection.vendor != "postgresql":
        require_postgres()
    from tests.support.factories import make_auth

    _unlimited_by_default(settings)
    tenant = Tenant.objects.create(slug="race10", max_concurrent_tasks=10)
    auths = [make_auth(tenant) for _ in range(4)]
    created, refused = _race_creations(auths)
    assert created == 10 and len(refused) == 190
    assert all(r == {"limit": 10, "scope": "tenant"} for r in refused)
    tenant.refresh_from_db()
    assert tenant.active_tasks == _live(tenant.pk) == 10
    assert sum(Principal.objects.filter(tenant=tenant).values_list("active_tasks", flat=True)) == 10


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_200_concurrent_creations_against_a_principal_limit_of_10(settings: Any) -> None:
    if connection.vendor != "postgresql":
        require_postgres()
    from tests.support.factories import make_auth

    _unlimited_by_default(settings)
    tenant = Tenant.objects.create(slug="race10p", max_concurrent_tasks_per_principal=10)
    auths = [make_auth(tenant) for _ in range(4)]
    created, refused = _race_creations(auths)
    assert created == 40 and len(refused) == 160
    assert all(r == {"limit": 10, "scope": "principal"} for r in refused)
    for auth in auths:
        assert Principal.objects.get(pk=auth.principal_id).active_tasks == _live(tenant.pk, auth.principal_id) == 10
    tenant.refresh_from_db()
    assert tenant.active_tasks == _live(tenant.pk) == 40


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_tenant_without_limits_takes_no_row_lock(settings: Any) -> None:
    """Creating and finishing the tasks of an unlimited tenant never waits for its row: here
    another transaction holds it locked, and both finish within a 1 s lock timeout."""
    if connection.vendor != "postgresql":
        require_postgres()

    from mcptasks.models import Outcome, Task
    from mcptasks.tasks import transitions
    from tests.support.factories import make_auth, make_task

    _unlimited_by_default(settings)
    tenant = Tenant.objects.create(slug="free")
    auth = make_auth(tenant)
    with counter_rows_held(tenant_id=tenant.pk, principal_id=auth.principal_id):
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '1s'")
        try:
            task = make_task(auth)
            Task.objects.filter(pk=task.pk).update(attempt=1)
            assert transitions.finish_runs(runs=[(task, Outcome(pk=task.pk, attempt=1, status="completed",
                                                             result={"content": []}))]) == [True]
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 0")
    tenant.refresh_from_db()
    assert tenant.active_tasks == 0  # not counted


@pytest.mark.django_db(transaction=True)
def test_a_limit_added_later_counts_the_tasks_already_running(settings: Any) -> None:
    """Counters are not kept while a tenant is unlimited; saving its first limit recounts them
    from the task table, so the limit holds for the tasks already running and slots come back."""
    from mcptasks.tasks import transitions
    from tests.support.factories import make_auth, make_task

    _unlimited_by_default(settings)
    tenant = Tenant.objects.create(slug="later")
    auth = make_auth(tenant)
    running = [make_task(auth) for _ in range(3)]
    tenant.refresh_from_db()
    assert tenant.active_tasks == 0
    tenant.max_concurrent_tasks = 4
    tenant.save()
    tenant.refresh_from_db()
    assert tenant.active_tasks == 3
    assert Principal.objects.get(pk=auth.principal_id).active_tasks == 3
    make_task(auth)
    with pytest.raises(QuotaExceeded):
        make_task(auth)
    transitions.cancel_task(auth=auth, task_id=running[0].task_id)
    tenant.refresh_from_db()
    assert tenant.active_tasks == 3
    make_task(auth)
