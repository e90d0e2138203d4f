"""Reads behind the operator dashboard: what happened in a tenant (or every visible one) lately.

Every figure is computed from the store (tasks, workers, the audit trail), so it is the same
whichever web process renders the page. Queries are bounded: hourly buckets over a fixed window
and at most ``DURATION_SAMPLE`` finished tasks for the duration percentiles.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Q
from django.db.models.functions import TruncHour
from django.utils import timezone

from mcptasks import conf
from mcptasks.audit import throttle
from mcptasks.models import LIVE, AuditEvent, Task, TaskStatus
from mcptasks.tasks import selectors
from tenants import access

WINDOW = dt.timedelta(hours=24)
DURATION_SAMPLE = 5000
#: Refusal series of the dashboard: chart label -> audit actions counted.
REFUSAL_SERIES = {
    "rate limited": ("ratelimit.refused",),
    "quota exceeded": ("quota.refused",),
    "failed lookups": ("task.lookup_failed",),
    "auth failures": ("auth.failed",),
}


@dataclass
class Dashboard:
    """Everything the dashboard page shows."""

    hours: list[str]
    tasks_by_status: dict[str, list[int]]
    refusals: dict[str, list[int]]
    durations: list[dict[str, Any]]
    workers_alive: int
    queue_depth: int
    live_tasks: int
    flagged: list[AuditEvent] = field(default_factory=list)

    def refusal_totals(self) -> list[dict[str, Any]]:
        """Per refusal series: its label, the audit actions it counts and its 24-hour total."""
        return [{"label": label, "kinds": " ".join(REFUSAL_SERIES.get(label, ())), "total": sum(counts)}
                for label, counts in self.refusals.items()]

    def chart_data(self) -> dict[str, Any]:
        """The JSON the page's charts read."""
        return {"hours": self.hours, "tasksByStatus": self.tasks_by_status, "refusals": self.refusals,
                "durations": self.durations, "workersAlive": self.workers_alive, "queueDepth": self.queue_depth,
                "liveTasks": self.live_tasks}


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; ``values`` not empty)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def durations_per_tool(tasks: Any, *, since: dt.datetime) -> dict[str, list[float]]:
    """Creation-to-end seconds of up to ``DURATION_SAMPLE`` of ``tasks`` finished since ``since``."""
    per_tool: dict[str, list[float]] = defaultdict(list)
    finished = (tasks.filter(finished_at__gte=since, finished_at__isnull=False).order_by("-finished_at")
                .values_list("tool_name", "created_at", "finished_at")[:DURATION_SAMPLE])
    for tool, created, ended in finished:
        per_tool[tool].append((ended - created).total_seconds())
    return dict(per_tool)


def _hour(value: dt.datetime) -> dt.datetime:
    return value.replace(minute=0, second=0, microsecond=0)


def refusal_counts(*, tenant_ids: frozenset[int] | None, hours: list[dt.datetime],
                   start: dt.datetime) -> dict[str, list[int]]:
    """Refusals per series and hour: every one, written or not.

    Refusals are audited throttled (:mod:`mcptasks.audit.throttle`): a written event counts one, an
    ``audit.suppressed`` event counts the refusals of its kind not written in its window (in the
    hour the window began), and counts not yet written (their window is running, or the flusher
    has not run yet) are read from the throttle's counters, so the figures match ``/metrics``.
    """
    index = {h: i for i, h in enumerate(hours)}
    refusals: dict[str, list[int]] = {label: [0] * len(hours) for label in REFUSAL_SERIES}
    label_of = {action: label for label, actions in REFUSAL_SERIES.items() for action in actions}
    events = access.scope_queryset(AuditEvent.objects.all(), tenant_ids).filter(
        created_at__gte=start - dt.timedelta(hours=1), action__in=[*label_of, throttle.SUPPRESSED_ACTION])
    for ev in events.only("created_at", "action", "data").iterator(chunk_size=2000):
        data = ev.data if isinstance(ev.data, dict) else {}
        if ev.action == throttle.SUPPRESSED_ACTION:
            label, count = label_of.get(str(data.get("kind"))), data.get("count")
            try:
                at = dt.datetime.fromisoformat(str(data.get("window_start")))
            except ValueError:
                at = ev.created_at
        else:
            # Events written before suppressed counts had events of their own carried them.
            legacy = data.get("suppressed", 0)
            label, count, at = label_of[ev.action], 1 + (legacy if isinstance(legacy, int) else 0), ev.created_at
        i = index.get(_hour(at))
        if label is not None and i is not None and isinstance(count, int):
            refusals[label][i] += count
    every_s = conf.get().AUDIT_REFUSAL_EVERY_S
    for (window, tenant, kind), count in throttle.throttle.pending().items():
        label = label_of.get(kind)
        visible = tenant_ids is None or tenant in tenant_ids
        i = index.get(_hour(dt.datetime.fromtimestamp(window * every_s, tz=dt.UTC)))
        if label is not None and visible and i is not None:
            refusals[label][i] += count
    return refusals


def build(*, tenant_ids: frozenset[int] | None, now: dt.datetime | None = None) -> Dashboard:
    """The dashboard of ``tenant_ids`` (None: every tenant)."""
    now = now or timezone.now()
    start = (now - WINDOW).replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1)
    hours = [start + dt.timedelta(hours=i) for i in range(24)]
    index = {h: i for i, h in enumerate(hours)}
    tasks = access.scope_queryset(Task.objects.filter(kind=Task.Kind.TASK), tenant_ids)

    by_status: dict[str, list[int]] = {s.value: [0] * len(hours) for s in TaskStatus}
    rows = (tasks.filter(created_at__gte=start).annotate(hour=TruncHour("created_at"))
            .values("hour", "status").annotate(n=Count("pk")).order_by())
    for row in rows:
        i = index.get(row["hour"])
        if i is not None and row["status"] in by_status:
            by_status[row["status"]][i] += row["n"]

    refusals = refusal_counts(tenant_ids=tenant_ids, hours=hours, start=start)

    per_tool = durations_per_tool(tasks, since=now - WINDOW)
    durations = [
        {"tool": tool, "count": len(v), "p50": round(percentile(v, 0.5), 3), "p95": round(percentile(v, 0.95), 3)}
        for tool, v in sorted(per_tool.items())
    ]

    live = tasks.filter(status__in=LIVE)
    flagged = list(access.scope_queryset(AuditEvent.objects.all(), tenant_ids)
                   .filter(action__startswith="flag.").select_related("tenant", "principal").order_by("-id")[:20])
    return Dashboard(
        hours=[h.strftime("%H:00") for h in hours],
        tasks_by_status=by_status,
        refusals=refusals,
        durations=durations,
        workers_alive=selectors.alive_workers(now=now).count(),
        queue_depth=live.filter(Q(worker_id__isnull=True) & Q(status=TaskStatus.WORKING)).count(),
        live_tasks=live.count(),
        flagged=flagged,
    )
