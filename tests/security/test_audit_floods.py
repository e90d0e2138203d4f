"""Audit floods (issue 25 item 8) and dashboard counts that match ``/metrics`` (issue 30 item 7).

An attacker must not turn refusals into audit rows: not with many lookups of another tenant's
task, not with many source addresses (IPv4 or a whole IPv6 /64), not by hitting several
processes. What is not written is still counted: in ``/metrics``, in ``audit.suppressed`` events
once the throttle window ends, and on the dashboard (which must then agree with ``/metrics``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from mcptasks.audit import housekeeping, throttle, watch
from mcptasks.audit import trail as audit
from mcptasks.console import dashboard
from mcptasks.models import AuditEvent
from mcptasks.observability.metrics import REGISTRY
from tests.support.clock import Clock, frozen_clock
from tests.support.factories import make_auth, make_task, make_tenant
from tests.support.requirements import require_postgres, require_redis

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _services(settings: Any) -> None:
    require_postgres()
    require_redis()
    # A long window (windows are fixed: an hour's boundary is unlikely to fall inside a test);
    # the tests that need one to end set a short one and align to its start.
    settings.MCPTASKS = {**settings.MCPTASKS, "AUDIT_REFUSAL_EVERY_S": 3600.0, "AUDIT_REFUSAL_BUDGET": 5}
    watch.throttle.clear()
    watch.flagged.clear()


def _sample(name: str, kind: str) -> float:
    return REGISTRY.get_sample_value(name, {"kind": kind}) or 0.0


def _other_process() -> None:
    """What a second web process would have: none of this process's in-memory state."""
    watch.throttle.forget_local()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    """The throttle's (and the watch's) clock, moved by hand to a window's edges."""
    with frozen_clock(monkeypatch, throttle, watch) as c:
        yield c


def _window_start(settings: Any, clock: Clock) -> None:
    """Move to a throttle window's start (windows are fixed: a burst must not straddle two)."""
    clock.to_next_multiple_of(settings.MCPTASKS["AUDIT_REFUSAL_EVERY_S"])


def _end_window(settings: Any, clock: Clock) -> None:
    """Move past the end of the current throttle window, then run the periodic pass."""
    clock.advance(settings.MCPTASKS["AUDIT_REFUSAL_EVERY_S"] + 0.05)
    housekeeping.housekeep()


def test_lookups_of_another_tenants_task_do_not_flood_the_owners_chain(settings: Any, clock: Clock) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "AUDIT_REFUSAL_EVERY_S": 5.0}
    owner, intruder = make_auth(make_tenant("victim")), make_auth(make_tenant("probe"))
    task = make_task(owner)
    _window_start(settings, clock)
    before = _sample("mcptasks_audit_suppressed_total", "task.cross_tenant")
    for _ in range(100):
        watch.lookup_failed(auth=intruder, method="tasks/get", task_id=task.task_id, error="Task not found")
    cross = AuditEvent.objects.filter(action="task.cross_tenant", tenant_id=owner.tenant_id)
    assert cross.count() == 1
    assert _sample("mcptasks_audit_suppressed_total", "task.cross_tenant") - before == 99
    _end_window(settings, clock)
    summary = AuditEvent.objects.get(action="audit.suppressed", tenant_id=owner.tenant_id)
    assert summary.data["kind"] == "task.cross_tenant" and summary.data["count"] == 99
    # Still nothing in the intruder's chain says the id exists.
    assert not AuditEvent.objects.filter(tenant_id=intruder.tenant_id, data__kind="task.cross_tenant").exists()


def test_auth_failures_from_many_addresses_are_held_to_the_kinds_budget() -> None:
    before = _sample("mcptasks_audit_suppressed_total", "auth.failed")
    for n in range(50):
        watch.auth_failed(ip=f"198.51.100.{n}", status=401, reason="Invalid token", path="/mcp", tenant_slug=None)
    assert AuditEvent.objects.filter(action="auth.failed").count() == 5  # AUDIT_REFUSAL_BUDGET
    assert _sample("mcptasks_audit_suppressed_total", "auth.failed") - before == 45


def test_ipv6_addresses_of_one_64_are_one_subject() -> None:
    for n in range(1, 4):
        watch.auth_failed(ip=f"2001:db8:1:2::{n:x}", status=401, reason="Invalid token", path="/mcp",
                          tenant_slug=None)
        watch.auth_failed(ip=f"2001:db8:1:2:{n:x}::", status=401, reason="Invalid token", path="/mcp",
                          tenant_slug=None)
    assert AuditEvent.objects.filter(action="auth.failed").count() == 1
    assert watch.ip_subject("2001:db8:1:2:ffff::1") == "2001:db8:1:2::/64"
    assert watch.ip_subject("not an address") == "unknown"


def test_the_throttle_holds_across_processes() -> None:
    auth = make_auth()
    for _ in range(3):
        _other_process()
        async_to_sync(watch.arefused)(auth=auth, action="ratelimit.refused", data={"class": "read"})
        watch.refused(auth=auth, action="quota.refused", data={"reason": "max_live_tasks"})
    assert AuditEvent.objects.filter(action="ratelimit.refused").count() == 1
    assert AuditEvent.objects.filter(action="quota.refused").count() == 1


def test_suppressed_counts_are_written_once_when_the_window_ends(settings: Any, clock: Clock) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "AUDIT_REFUSAL_EVERY_S": 1.0}
    tenant = make_tenant("victim")
    auth = make_auth(tenant)
    _window_start(settings, clock)
    for _ in range(7):
        watch.refused(auth=auth, action="ratelimit.refused", data={"class": "read"})
    _end_window(settings, clock)
    _other_process()
    housekeeping.housekeep()  # a second process's pass finds nothing left to write
    summaries = list(AuditEvent.objects.filter(action="audit.suppressed"))
    assert [(e.tenant_id, e.data["kind"], e.data["count"]) for e in summaries] == [
        (tenant.pk, "ratelimit.refused", 6)]
    assert audit.verify(chain=tenant.pk).ok


def test_dashboard_counts_match_metrics_after_a_burst(settings: Any, clock: Clock) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "AUDIT_REFUSAL_EVERY_S": 1.0}
    tenant = make_tenant("burst")
    auth = make_auth(tenant)
    kinds = {"task.lookup_failed": "failed lookups", "auth.failed": "auth failures", "quota.refused": "quota exceeded",
             "ratelimit.refused": "rate limited"}
    before = {k: _sample("mcptasks_refusals_total", k) for k in kinds}
    for n in range(6):
        watch.lookup_failed(auth=auth, method="tasks/get", task_id=f"missing-{n}", error="Task not found")
        watch.auth_failed(ip=f"203.0.113.{n % 2}", status=401, reason="Invalid token", path="/mcp/t/burst",
                          tenant_slug="burst")
        async_to_sync(watch.arefused)(auth=auth, action="quota.refused", data={"reason": "max_live_tasks"})
        if n % 3 == 0:
            watch.refused(auth=auth, action="ratelimit.refused", data={"class": "read"})
    sent = {k: _sample("mcptasks_refusals_total", k) - before[k] for k in kinds}
    assert sent == {"task.lookup_failed": 6, "auth.failed": 6, "quota.refused": 6, "ratelimit.refused": 2}
    root = Client()
    root.force_login(get_user_model().objects.create_superuser(username="root", password="pw", email=""))

    def shown() -> dict[str, int]:
        every = dashboard.build(tenant_ids=None).refusals
        assert {k: sum(every[label]) for k, label in kinds.items()} == sent
        # What the page fetches to refresh itself, for the tenant.
        mine = root.get(reverse("dashboard"), {"tenant": "burst", "format": "json"}).json()["refusals"]
        return {k: sum(mine[label]) for k, label in kinds.items()}

    assert shown() == sent  # while the window runs: the throttle's counts
    _end_window(settings, clock)
    assert AuditEvent.objects.filter(action="audit.suppressed", tenant_id=tenant.pk).exists()
    assert shown() == sent  # afterwards: the audit.suppressed events
