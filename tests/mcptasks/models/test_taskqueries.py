"""The task data layer on PostgreSQL: the order in which its statements lock a worker's runs."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from mcptasks.models import Outcome, Task
from mcptasks.tasks import runs
from tests.support.factories import in_thread_db, task_row
from tests.support.requirements import require_postgres

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _postgres() -> None:
    require_postgres()


def _lock_waiters() -> int:
    """Backends of this database waiting for a row lock now."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")  # else a transaction sees its first reading again
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'")
        return int(cur.fetchone()[0])


def _two_runs_scanned_out_of_key_order() -> tuple[Task, Task]:
    """Two runs of worker ``w`` whose rows a renewal of both would lock in the opposite order to
    their keys, whichever way it scans: the second's task id sorts first, and it comes first in
    the table's physical order (the first row was rewritten after it)."""
    lease = timezone.now() + dt.timedelta(seconds=60)
    first = task_row("demo_sleep", task_id="z" * 32, attempt=1, worker_id="w", lease_expires_at=lease)
    second = task_row("demo_sleep", task_id="a" * 32, attempt=1, worker_id="w", lease_expires_at=lease)
    Task.objects.filter(pk=first.pk).update(status_message="rewritten")  # its new version lands after the second
    assert first.pk < second.pk
    return first, second


def test_a_lease_renewal_and_a_finish_of_the_same_runs_never_deadlock() -> None:
    """A finish locks its runs in key order (as the finish statement does); a renewal of the same
    runs that locked them in another order waited for it while it waited for the renewal, and
    PostgreSQL failed one of the two after ``deadlock_timeout``. The renewal now locks in key
    order too: it waits behind the finish, then renews what is still live."""
    first, second = _two_runs_scanned_out_of_key_order()
    errors: list[BaseException] = []
    renewed: list[list[str]] = []
    first_locked, renewal_started = threading.Event(), threading.Event()

    def finisher() -> None:
        try:
            with transaction.atomic():
                # The finish's order: the lower key first, then (once the renewal is under way) the next.
                list(Task.objects.filter(pk=first.pk).select_for_update(no_key=True))
                first_locked.set()
                assert renewal_started.wait(10)
                deadline = time.monotonic() + 10
                while _lock_waiters() == 0 and time.monotonic() < deadline:
                    time.sleep(0.02)  # the renewal is waiting for a row this transaction holds
                list(Task.objects.filter(pk=second.pk).select_for_update(no_key=True))
                Task.objects.filter(pk__in=[first.pk, second.pk]).update(status_message="finished")
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    def renewer() -> None:
        try:
            assert first_locked.wait(10)
            renewal_started.set()
            renewed.append(runs.renew_leases(worker_id="w", runs={first.task_id: 1, second.task_id: 1}))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=in_thread_db(fn)) for fn in (finisher, renewer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []  # before: "deadlock detected" in one of them
    assert renewed == [[]]  # both runs still live and ours: none to stop
    assert set(Task.objects.filter(pk__in=[first.pk, second.pk]).values_list("status_message", flat=True)) == {
        "finished"}


def test_a_renewal_reports_runs_finished_cancelled_or_taken_over() -> None:
    """What the renewal answers on PostgreSQL (one statement): the runs to stop, and no lease
    extended but those of live, uncancelled runs of this worker."""
    lease = timezone.now() + dt.timedelta(seconds=5)
    live, done, cancelled, taken, rerun = (
        task_row("demo_sleep", attempt=1, worker_id="w", lease_expires_at=lease) for _ in range(5))
    Task.objects.filter(pk=done.pk).update(status="completed")
    Task.objects.filter(pk=cancelled.pk).update(cancel_requested=True)
    Task.objects.filter(pk=taken.pk).update(attempt=2, worker_id="other")
    Task.objects.filter(pk=rerun.pk).update(attempt=2)  # this worker's next attempt, not the one asked about
    stop = runs.renew_leases(worker_id="w", runs={t.task_id: 1 for t in (live, done, cancelled, taken, rerun)})
    assert sorted(stop) == sorted(t.task_id for t in (done, cancelled, taken, rerun))
    leases: dict[int, Any] = dict(Task.objects.values_list("pk", "lease_expires_at"))
    assert leases[live.pk] > lease and leases[rerun.pk] > lease
    assert leases[done.pk] == lease and leases[cancelled.pk] == lease and leases[taken.pk] == lease


def test_the_orm_finish_locks_its_runs_in_key_order() -> None:
    """The ORM's batch of outcomes (the path behind a transaction pooler) locks in key order too."""
    first, second = _two_runs_scanned_out_of_key_order()
    seen: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record), transaction.atomic():
        Task.objects.filter(pk__in=[first.pk, second.pk]).finish(
            [Outcome(pk=p, attempt=1, status="completed", result={"content": []}) for p in (second.pk, first.pk)],
            now=timezone.now())
    (locking,) = [sql for sql in seen if "FOR NO KEY UPDATE" in sql or "FOR UPDATE" in sql]
    assert re.search(r'ORDER BY (1|"mcptasks_task"\."seq") ASC FOR UPDATE$', locking), locking
    assert set(Task.objects.filter(pk__in=[first.pk, second.pk]).values_list("status", flat=True)) == {"completed"}
