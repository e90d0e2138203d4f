"""What a worker does to the task store: claim runs, renew and hand back leases, check that a
run is still current, save its progress. Each is a named transition of
:class:`~mcptasks.models.TaskQuerySet`; the worker holds no queries of its own."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from mcptasks import conf
from mcptasks.models import Claimed, Task
from mcptasks.streams import signals


def _lease_until(now: dt.datetime) -> dt.datetime:
    return now + dt.timedelta(seconds=conf.get().WORKER_LEASE_S)


def claim_runs(*, worker_id: str, limit: int, exclude: list[str], limited: dict[str, int],
               tenant_running: dict[int, int], tenant_cap: int | None) -> Claimed:
    """Take up to ``limit`` runnable tasks for ``worker_id`` with a fresh lease (see
    :meth:`TaskQuerySet.claim <mcptasks.models.TaskQuerySet.claim>`)."""
    now = timezone.now()
    return Task.objects.claim(
        worker_id=worker_id, limit=limit, now=now, lease_until=_lease_until(now), exclude=exclude,
        limited=limited, tenant_running=tenant_running, tenant_cap=tenant_cap,
    )


def renew_leases(*, worker_id: str, runs: dict[str, int]) -> list[str]:
    """Extend every lease ``worker_id`` holds (task id -> attempt) in one UPDATE; the task ids
    whose run must stop (cancelled, finished, or taken over by another attempt)."""
    return Task.objects.renew(worker_id=worker_id, runs=runs, lease_until=_lease_until(timezone.now()))


def hand_back(*, worker_id: str, runs: list[tuple[str, int]]) -> int:
    """Release ``worker_id``'s leases at once (shutdown); the interrupted attempts do not count
    against ``max_attempts``. Wakes the workers when any was released; returns how many."""
    n = Task.objects.hand_back(worker_id=worker_id, runs=runs)
    if n:
        signals.wake_workers()
    return n


def is_current_run(*, task_id: str, attempt: int) -> bool:
    """Whether ``attempt`` is still the live, uncancelled run of the task."""
    return Task.objects.is_current_run(task_id=task_id, attempt=attempt)


def save_progress(*, task_id: str, attempt: int, report: dict[str, Any]) -> None:
    """Keep a live run's latest progress report on its task (the operator's task page)."""
    Task.objects.live().filter(task_id=task_id, attempt=attempt).update(progress=report)
