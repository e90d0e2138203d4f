"""Refusals in the audit trail (throttled) and the suspicious patterns they form."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from mcptasks.audit import throttle, watch
from mcptasks.models import AuditEvent
from tenants import kv, ratelimit
from tenants.exceptions import RateLimited
from tenants.ratelimit import penalties
from tests.support.clock import frozen_clock
from tests.support.factories import make_auth, make_task, make_tenant

pytestmark = pytest.mark.django_db


def _forget_counters() -> None:
    """Pattern counters and penalty budgets live ~1 min in Redis; principal ids repeat across runs."""

    def remote(r: Any) -> None:
        for pattern in (kv.key("watch:*"), kv.key("rl:p*")):
            for key in r.scan_iter(match=pattern):
                r.delete(key)

    kv.call(remote, fallback=lambda store: store.clear())


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    watch.throttle.clear()
    watch.flagged.clear()
    kv.local.clear()
    _forget_counters()
    penalties.clear_penalties()
    yield
    watch.throttle.clear()
    penalties.clear_penalties()


def test_refusals_are_audited_at_most_once_per_interval_with_the_suppressed_count(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcptasks.audit import housekeeping as audit

    settings.MCPTASKS = {**settings.MCPTASKS, "AUDIT_REFUSAL_EVERY_S": 2.0}
    auth = make_auth()
    with frozen_clock(monkeypatch, watch, throttle) as clock:
        clock.to_next_multiple_of(2.0)  # a window's start: the burst stays within one
        for _ in range(50):
            async_to_sync(watch.arefused)(auth=auth, action="ratelimit.refused", data={"class": "read"})
        events = list(AuditEvent.objects.filter(action="ratelimit.refused"))
        assert len(events) == 1 and "suppressed" not in events[0].data
        clock.to_next_multiple_of(2.0)  # the window ended
        audit.housekeep()
        summary = AuditEvent.objects.get(action="audit.suppressed")
        assert (summary.tenant_id, summary.data["kind"], summary.data["count"]) == (
            auth.tenant_id, "ratelimit.refused", 49)
        async_to_sync(watch.arefused)(auth=auth, action="ratelimit.refused", data={"class": "read"})
        latest = AuditEvent.objects.filter(action="ratelimit.refused").order_by("-id").first()
        assert latest is not None and latest.pk != events[0].pk and latest.principal_id == auth.principal_id


def test_the_in_process_suppressed_counts_are_bounded(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "AUDIT_REFUSAL_BUDGET": 0}
    monkeypatch.setattr(kv, "client", lambda: None)  # no Redis: the in-process fallback
    for n in range(watch._MAX_SUBJECTS + 100):
        assert not watch.throttle.admit("auth.failed", f"10.0.{n // 256}.{n % 256}", tenant_id=n + 1)
    assert len(watch.throttle._pending) == watch._MAX_SUBJECTS


def test_enumeration_is_flagged_once_and_tightens_the_principals_rate(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "WATCH_LOOKUP_FAILURES": 5}
    settings.TENANTS = {**settings.TENANTS, "FLAG_PENALTY_S": 60, "FLAG_PENALTY_RATE_PER_MIN": 3}
    auth = make_auth()
    ratelimit.check_rate(auth=auth, op_class="read")  # unlimited tenant, no penalty yet
    for n in range(12):
        watch.lookup_failed(auth=auth, method="tasks/get", task_id=f"guess-{n}", error="Task not found")
    flags = list(AuditEvent.objects.filter(action="flag.enumeration"))
    assert len(flags) == 1
    assert flags[0].principal_id == auth.principal_id and flags[0].data["penalty_s"] == 60
    assert penalties.penalty_of(principal_id=auth.principal_id) == 3
    for _ in range(3):
        ratelimit.check_rate(auth=auth, op_class="read")
    with pytest.raises(RateLimited):
        ratelimit.check_rate(auth=auth, op_class="read")
    # Another principal of the same tenant is not penalised.
    other = make_auth(make_tenant())
    for _ in range(10):
        ratelimit.check_rate(auth=other, op_class="read")


def test_without_a_penalty_setting_flags_do_not_limit(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "WATCH_LOOKUP_FAILURES": 2}
    auth = make_auth()
    for n in range(3):
        watch.lookup_failed(auth=auth, method="tasks/get", task_id=f"g{n}", error="Task not found")
    assert AuditEvent.objects.filter(action="flag.enumeration").count() == 1
    assert penalties.penalty_of(principal_id=auth.principal_id) is None


def test_a_lookup_of_another_tenants_task_is_recorded_in_the_owners_chain_only() -> None:
    owner, intruder = make_auth(), make_auth(make_tenant())
    task = make_task(owner)
    watch.lookup_failed(auth=intruder, method="tasks/get", task_id=task.task_id, error="Task not found")
    cross = AuditEvent.objects.get(action="task.cross_tenant")
    assert cross.tenant_id == owner.tenant_id and cross.data["from_tenant"] == intruder.tenant_slug
    # The intruder's own trail says only "lookup failed", like for any missing task.
    mine = set(AuditEvent.objects.filter(tenant_id=intruder.tenant_id).values_list("action", flat=True))
    assert mine == {"task.lookup_failed"}


def test_repeated_authentication_failures_from_one_ip_are_flagged(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "WATCH_AUTH_FAILURES": 4}
    tenant = make_tenant("victim")
    for _ in range(6):
        watch.auth_failed(ip="203.0.113.9", status=401, reason="Invalid token", path="/mcp/t/victim",
                          tenant_slug="victim")
    watch.auth_failed(ip="198.51.100.1", status=401, reason="Invalid token", path="/mcp", tenant_slug=None)
    failed = list(AuditEvent.objects.filter(action="auth.failed").order_by("id"))
    assert [(e.tenant_id, e.data["ip"]) for e in failed] == [(tenant.pk, "203.0.113.9"), (None, "198.51.100.1")]
    flag = AuditEvent.objects.get(action="flag.auth_failures")
    assert flag.data["ip"] == "203.0.113.9" and flag.data["count"] == 4


def test_client_ip_never_passes_a_client_string() -> None:
    assert watch.client_ip({"client": ["::1", 5]}) == "::1"
    assert watch.client_ip({"client": ["evil\r\nkey", 5]}) == "unknown"
    assert watch.client_ip({}) == "unknown"


def test_polling_faster_than_poll_interval_is_flagged(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "WATCH_FAST_POLLS": 3}
    tenant = make_tenant(rate_read_per_min=10_000, poll_interval_ms=60_000)
    auth = make_auth(tenant)
    task = make_task(auth)
    too_soon = [ratelimit.note_poll(auth=auth, task_id=task.task_id, poll_interval_ms=60_000) for _ in range(5)]
    assert too_soon == [False, True, True, True, True]
    for early in too_soon:
        if early:
            watch.fast_poll(auth=auth)
    flag = AuditEvent.objects.get(action="flag.fast_polling")
    assert flag.principal_id == auth.principal_id and flag.data["count"] == 3


def test_a_flagged_principal_costs_no_more_counting_until_the_next_window(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "WATCH_FAST_POLLS": 3}
    auth = make_auth()
    for _ in range(3):
        async_to_sync(watch.afast_poll)(auth=auth)
    assert AuditEvent.objects.filter(action="flag.fast_polling").count() == 1
    from unittest import mock

    with mock.patch.object(watch.kv, "acall") as acall, mock.patch.object(watch.kv, "call") as call:
        for _ in range(20):
            async_to_sync(watch.afast_poll)(auth=auth)
    assert acall.call_count == 0 and call.call_count == 0
    assert AuditEvent.objects.filter(action="flag.fast_polling").count() == 1
