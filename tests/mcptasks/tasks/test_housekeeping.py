"""Cleanup of dead worker rows and session activity tracking."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from mcptasks.models import McpSession, WorkerHeartbeat
from mcptasks.tasks import cleanup, sessions


@pytest.mark.django_db
def test_cleanup_removes_heartbeat_rows_of_dead_workers_only() -> None:
    now = timezone.now()
    WorkerHeartbeat.objects.create(worker_id="dead", hostname="h", pid=1, concurrency=1,
                                   last_seen_at=now - dt.timedelta(hours=1))
    WorkerHeartbeat.objects.create(worker_id="alive", hostname="h", pid=2, concurrency=1, last_seen_at=now)
    counts = cleanup.cleanup_expired()
    assert counts["workers"] == 1
    assert list(WorkerHeartbeat.objects.values_list("worker_id", flat=True)) == ["alive"]


@pytest.mark.django_db
def test_touch_session_records_activity_at_most_once_a_minute(session: McpSession) -> None:
    old = timezone.now() - dt.timedelta(hours=2)
    McpSession.objects.filter(pk=session.pk).update(last_seen_at=old)
    session.refresh_from_db()
    sessions.touch_session(session=session)
    first = McpSession.objects.get(pk=session.pk).last_seen_at
    assert first > old
    sessions.touch_session(session=session)
    assert McpSession.objects.get(pk=session.pk).last_seen_at == first
