"""A worker's liveness row (:class:`~mcptasks.models.WorkerHeartbeat`): what operators and
``/metrics`` see of each worker process."""

from __future__ import annotations

from django.utils import timezone

from mcptasks.models import WorkerHeartbeat


def worker_gone(*, worker_id: str) -> None:
    """A worker exited cleanly: its heartbeat row goes."""
    WorkerHeartbeat.objects.filter(worker_id=worker_id).delete()


def worker_heartbeat(*, worker_id: str, hostname: str, pid: int, concurrency: int, running: int,
                     stopping: bool = False, rss_bytes: int = 0, asyncio_tasks: int = 0) -> None:
    """Register or refresh a worker's liveness row (with its memory figures for ``/metrics``)."""
    WorkerHeartbeat.objects.update_or_create(
        worker_id=worker_id,
        defaults={
            "hostname": hostname,
            "pid": pid,
            "concurrency": concurrency,
            "running": running,
            "last_seen_at": timezone.now(),
            "stopping": stopping,
            "rss_bytes": rss_bytes,
            "asyncio_tasks": asyncio_tasks,
        },
    )


def want_wakeups(*, worker_id: str, wants: bool) -> bool:
    """Set whether the worker asks for NOTIFY wake-ups (:mod:`mcptasks.db.wakeups`), committed on
    return; False if it has no row (its next heartbeat makes one, asking for them)."""
    return WorkerHeartbeat.objects.filter(worker_id=worker_id).update(wants_wakeups=wants) > 0
