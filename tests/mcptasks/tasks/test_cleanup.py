"""``manage.py mcptasks_cleanup``: expired tasks and their messages go, in bounded batches."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from mcptasks.models import AuditEvent, Task, TaskMessage, TaskStatus
from mcptasks.tasks import cleanup, creation, messages, transitions
from tenants.models import Principal, Tenant
from tests.support.factories import expire, make_auth, make_session, make_task, make_tenant
from tests.support.requirements import require_postgres


class BatchSpy:
    """Wraps cleanup._delete_batch and records how many expired tasks each batch deleted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.task_batches: list[int] = []
        real = cleanup._delete_batch

        def spy(flt: Any, batch: int, *, release: bool) -> int:
            n = real(flt, batch, release=release)
            if ("kind", "task") in flt.children:  # the expired-task pass (not the plain-request one)
                self.task_batches.append(n)
            return n

        monkeypatch.setattr(cleanup, "_delete_batch", spy)


@pytest.mark.django_db
def test_cleanup_command_deletes_expired_tasks_in_bounded_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = make_auth()
    session = make_session(auth)
    expired = [make_task(auth, session) for _ in range(25)]
    for task in expired:
        expire(task)
    spy = BatchSpy(monkeypatch)
    out = io.StringIO()
    call_command("mcptasks_cleanup", "--batch-size", "10", stdout=out)
    assert spy.task_batches == [10, 10, 5]
    assert "deleted 25 expired tasks" in out.getvalue()
    assert not Task.objects.filter(pk__in=[t.pk for t in expired]).exists()


@pytest.mark.django_db
def test_cleanup_deletes_task_messages_releases_slots_and_keeps_unexpired() -> None:
    auth = make_auth()
    session = make_session(auth)
    live_expired = [make_task(auth, session) for _ in range(3)]
    done_expired = make_task(auth, session)
    transitions.transition(task=done_expired, to=TaskStatus.COMPLETED, result={"content": []})
    asking = live_expired[0]
    messages.add_task_message(task=asking, method="elicitation/create", params={"message": "?"})
    keep = [make_task(auth, session, ttl_ms=3_600_000) for _ in range(2)]
    for task in [*live_expired, done_expired]:
        expire(task)
    assert Principal.objects.get(pk=auth.principal_id).active_tasks == 5  # 3 expired-live + 2 kept
    assert TaskMessage.objects.filter(task=asking).count() == 1

    call_command("mcptasks_cleanup", "--batch-size", "2", stdout=io.StringIO())

    assert set(Task.objects.filter(principal_id=auth.principal_id).values_list("pk", flat=True)) == {
        t.pk for t in keep
    }
    assert TaskMessage.objects.count() == 0
    # The slots of the three non-terminal expired tasks are free again; the kept ones still count.
    assert Principal.objects.get(pk=auth.principal_id).active_tasks == 2
    assert Tenant.objects.get(pk=auth.tenant_id).active_tasks == 2
    # Each deleted task leaves an audit event in its tenant's chain, with the status it had.
    expired = dict(AuditEvent.objects.filter(action="task.expired").values_list("task_id", "data__status"))
    assert expired == {**{t.task_id: "working" for t in live_expired[1:]}, asking.task_id: "input_required",
                       done_expired.task_id: "completed"}


@pytest.mark.django_db
def test_cleanup_with_nothing_expired_deletes_nothing() -> None:
    auth = make_auth()
    tasks = [make_task(auth) for _ in range(3)]
    out = io.StringIO()
    call_command("mcptasks_cleanup", stdout=out)
    assert "deleted 0 expired tasks" in out.getvalue()
    assert Task.objects.filter(pk__in=[t.pk for t in tasks]).count() == 3


@pytest.mark.django_db(transaction=True)
def test_concurrent_cleaners_never_delete_the_same_rows_twice() -> None:
    require_postgres()
    n_expired = 120
    # More live tasks than the default concurrency quota: the tenant's own limit allows them.
    auth = make_auth(make_tenant(max_concurrent_tasks=n_expired + 1))
    session = make_session(auth)
    for _ in range(n_expired):
        expire(make_task(auth, session))
    keep = make_task(auth, session)
    totals: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def cleaner() -> None:
        try:
            barrier.wait(10)
            totals.append(cleanup.cleanup_expired(batch_size=5)["tasks"])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=cleaner) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    assert sum(totals) == n_expired, totals
    assert list(Task.objects.filter(principal_id=auth.principal_id).values_list("pk", flat=True)) == [keep.pk]
    # Each slot was released exactly once: only the kept task still holds one.
    assert Principal.objects.get(pk=auth.principal_id).active_tasks == 1


def _plain_request(auth: Any, session: Any, *, idle_s: float) -> Task:
    import datetime as dt

    from django.utils import timezone

    from tests.support.factories import demo_tool

    row = creation.create_task(
        auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1}, request_id=f"r{idle_s}",
        progress_token=None, kind=Task.Kind.REQUEST, stream_id="p" + "0" * 16,
    )
    Task.objects.filter(pk=row.pk).update(last_updated_at=timezone.now() - dt.timedelta(seconds=idle_s))
    return row


@pytest.mark.django_db
def test_cleanup_never_deletes_a_running_plain_request(settings: Any) -> None:
    """Issue 11 item 3: a long tools/call whose row is untouched for a while is still running."""
    settings.MCPTASKS = {**settings.MCPTASKS, "REQUEST_RETENTION_S": 60}
    auth = make_auth()
    session = make_session(auth)
    running = _plain_request(auth, session, idle_s=3600)
    finished = _plain_request(auth, session, idle_s=3600)
    Task.objects.filter(pk=finished.pk).update(status=TaskStatus.COMPLETED)
    cleanup.cleanup_expired()
    assert Task.objects.filter(pk=running.pk).exists()
    assert not Task.objects.filter(pk=finished.pk).exists()
    # Once its session is gone, even a running request is swept.
    session.delete()
    cleanup.cleanup_expired()
    assert not Task.objects.filter(pk=running.pk).exists()


@pytest.mark.processes(reason="reads the environment in a fresh interpreter (python -c)")
def test_request_retention_is_read_from_the_environment() -> None:
    """Every documented variable is read: MCPTASKS_REQUEST_RETENTION_S was not."""
    import subprocess
    import sys

    from tests.support.servers import REPO

    out = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from mcptasks import conf; "
         "print(conf.get().REQUEST_RETENTION_S)"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "mcptasks.settings",
             "MCPTASKS_REQUEST_RETENTION_S": "1234", "DATABASE_URL": "sqlite:////tmp/x.sqlite3"},
    )
    assert out.stdout.strip() == "1234", out.stderr[-1000:]
