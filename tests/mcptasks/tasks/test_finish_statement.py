"""A worker's batch of outcomes on PostgreSQL: one statement, the same rows as the ORM transaction.

:func:`mcptasks.tasks.transitions.finish_runs` writes the outcomes, drops the unanswered input
requests, appends the audit events and gives the quota slots back in one statement
(``mcptasks/models/finishsql.py``) run in autocommit, so no lock (a limited tenant's counter row
included) outlives it and no transaction waits on the worker. These tests hold it to the ORM
transaction's guarantees.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from mcptasks.models import AuditEvent, Outcome, StreamCursor, StreamEvent, Task, TaskMessage
from mcptasks.streams import events, signals
from mcptasks.tasks import finishsql, transitions
from tenants import quotas
from tenants.models import Principal, Tenant
from tenants.selectors import clear_limits_cache
from tests.support.factories import in_thread_db, make_auth, make_session, make_task
from tests.support.pages import pages_fetched
from tests.support.requirements import require_postgres
from tests.support.row_locks import counter_rows_held

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _postgres(settings: Any) -> None:
    require_postgres()
    settings.TENANTS = {**settings.TENANTS, "TASK_MAX_CONCURRENT": 0}
    clear_limits_cache()


@contextmanager
def _statements() -> Iterator[list[tuple[str, bool]]]:
    """Every statement this thread's connection runs inside, with whether a transaction was open."""
    seen: list[tuple[str, bool]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((sql, connection.in_atomic_block))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield seen


def _claimed(task: Task) -> Task:
    """``task`` as a worker's run of attempt 1 holds it."""
    Task.objects.filter(pk=task.pk).update(attempt=1, worker_id="w")
    task.refresh_from_db()
    return task


def test_a_batch_is_one_statement_in_autocommit_with_every_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outcome, dropped input request, audit event, slot release and the requestor's stream
    events: one statement, no transaction; the pushes and task signals follow it."""
    tenant = Tenant.objects.create(slug="limited", max_concurrent_tasks=5)
    auth = make_auth(tenant)
    session = make_session(auth)
    done, failed = (_claimed(make_task(auth, session)) for _ in range(2))
    TaskMessage.objects.create(task=failed, rpc_id="rpc-pending", method="elicitation/create", params={})
    stream = events.get_stream_id(session.pk)
    StreamCursor.objects.create(stream_id=stream, session_id=session.pk, last_seq=7)
    assert Tenant.objects.get(pk=tenant.pk).active_tasks == 2
    sent: list[tuple[list[Any], list[Any]]] = []
    monkeypatch.setattr(signals, "send_many", lambda pushes, sigs: sent.append((pushes, sigs)))
    ok = {"content": [{"type": "text", "text": "ok"}]}
    runs = [
        (done, Outcome(pk=done.pk, attempt=1, status="completed", result=ok)),
        (failed, Outcome(pk=failed.pk, attempt=1, status="failed", message="boom",
                         error={"code": -32603, "message": "boom"})),
    ]
    with _statements() as seen:
        assert transitions.finish_runs(runs=runs) == [True, True]
    # One statement writes (a read of the session's era, cached per process, may come first),
    # outside any transaction: its locks end with it.
    writes = [sql for sql, _ in seen if not sql.lstrip().startswith("SELECT")]
    assert len(writes) == 1 and writes[0].lstrip().startswith("WITH"), writes
    assert not any(in_transaction for _, in_transaction in seen)
    assert Tenant.objects.get(pk=tenant.pk).active_tasks == 0
    assert Principal.objects.get(pk=auth.principal_id).active_tasks == 0
    assert not TaskMessage.objects.filter(task=failed).exists()
    rows = {t.pk: t for t in Task.objects.filter(pk__in=[done.pk, failed.pk])}
    assert rows[done.pk].result == ok and rows[done.pk].error is None
    assert rows[failed.pk].status_message == "boom" and rows[failed.pk].error == {"code": -32603, "message": "boom"}
    assert rows[done.pk].finished_at == rows[done.pk].last_updated_at and rows[done.pk].lease_expires_at is None
    assert done.status == "completed" and failed.status_message == "boom"  # the in-memory tasks as written
    audited = dict(AuditEvent.objects.filter(task_id__in=[done.task_id, failed.task_id], action__startswith="task.")
                   .exclude(action="task.create").values_list("task_id", "data"))
    assert audited == {done.task_id: {}, failed.task_id: {"statusMessage": "boom"}}
    # The status notifications, numbered after the cursor in the batch's order, then pushed.
    stored = list(StreamEvent.objects.filter(stream_id=stream).order_by("seq").values_list("seq", "data"))
    assert [seq for seq, _ in stored] == [8, 9]
    assert [json.loads(data)["params"]["status"] for _, data in stored] == ["completed", "failed"]
    assert StreamCursor.objects.get(stream_id=stream).last_seq == 9
    assert len(sent) == 1
    pushes, sigs = sent[0]
    assert [p[1]["event_id"] for p in pushes] == [f"{stream}.8", f"{stream}.9"]
    assert [p[1]["data"] for p in pushes] == [data for _, data in stored]
    assert [s[1]["status"] for s in sigs] == ["completed", "failed"]


def test_a_stream_without_a_cursor_gets_its_event_after_the_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream's first event (no cursor row yet) is published the usual way, not lost; but a
    GET stream without one was never opened: its session's client cannot read it, and the
    statement hands nothing back to publish (issue 27)."""
    auth = make_auth()
    session, unopened = make_session(auth), make_session(auth)
    task, other = _claimed(make_task(auth, session)), _claimed(make_task(auth, unopened))
    stream = "rFIRST"
    Task.objects.filter(pk=task.pk).update(stream_id=stream)  # its tasks/result stream is open
    task.stream_id = stream
    get_stream = events.get_stream_id(unopened.pk)
    published: list[Any] = []
    real = events.publish_many
    monkeypatch.setattr(events, "publish_many", lambda items, **kw: published.extend(items) or real(items, **kw))
    transitions.finish_runs(runs=[(t, Outcome(pk=t.pk, attempt=1, status="completed", result={"content": []}))
                                  for t in (task, other)])
    stored = list(StreamEvent.objects.filter(stream_id=stream).values_list("seq", "data"))
    assert [(seq, json.loads(data)["params"]["status"]) for seq, data in stored] == [(1, "completed")]
    assert StreamCursor.objects.get(stream_id=stream).last_seq == 1
    assert [s for _session, s, _m in published] == [stream]
    assert not StreamEvent.objects.filter(stream_id=get_stream).exists()
    assert not StreamCursor.objects.filter(stream_id=get_stream).exists()


def test_a_superseded_or_ended_run_writes_nothing_and_keeps_its_slot() -> None:
    tenant = Tenant.objects.create(slug="limited2", max_concurrent_tasks=5)
    auth = make_auth(tenant)
    session = make_session(auth)
    superseded, cancelled = (_claimed(make_task(auth, session)) for _ in range(2))
    Task.objects.filter(pk=superseded.pk).update(attempt=2)
    transitions.cancel_task(auth=auth, task_id=cancelled.task_id)
    runs = [(t, Outcome(pk=t.pk, attempt=1, status="completed", result={"content": []}))
            for t in (superseded, cancelled)]
    assert transitions.finish_runs(runs=runs) == [False, False]
    assert Task.objects.get(pk=superseded.pk).status == "working"
    assert Task.objects.get(pk=cancelled.pk).result is None
    assert Tenant.objects.get(pk=tenant.pk).active_tasks == 1  # the superseded run's slot stays taken
    assert not AuditEvent.objects.filter(task_id=superseded.task_id, action="task.completed").exists()


def test_a_tenant_without_limits_locks_no_counter_row() -> None:
    """Its counter rows held by another transaction do not delay the finish."""
    auth = make_auth()
    task = _claimed(make_task(auth))
    with counter_rows_held(tenant_id=auth.tenant_id, principal_id=auth.principal_id):
        started = time.monotonic()
        written = in_thread_db(lambda: transitions.finish_runs(
            runs=[(task, Outcome(pk=task.pk, attempt=1, status="completed", result={"content": []}))]))
        result: list[Any] = []
        runner = threading.Thread(target=lambda: result.append(written()))
        runner.start()
        runner.join(5)
        assert result == [[True]], "the finish waited for the tenant's counter rows"
        assert time.monotonic() - started < 5


def test_counters_stay_exact_when_batches_race_each_other_and_creations() -> None:
    """Batches of two limited tenants in random orders, the same task in several batches, and
    creations of both tenants at once: no deadlock, no slot given back twice, counters exact."""
    tenants = [Tenant.objects.create(slug=f"race{i}", max_concurrent_tasks=60, max_concurrent_tasks_per_principal=40)
               for i in range(2)]
    auths = [make_auth(t) for t in tenants for _ in range(2)]
    tasks = [_claimed(make_task(a)) for a in auths for _ in range(12)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def finisher(seed: int) -> None:
        rng = random.Random(seed)  # noqa: S311 - test data
        barrier.wait(10)
        for _ in range(6):
            batch = rng.sample(tasks, 10)
            try:
                transitions.finish_runs(runs=[(Task.objects.get(pk=t.pk), Outcome(pk=t.pk, attempt=1,
                                         status="completed", result={"content": []})) for t in batch])
            except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    def creator(i: int) -> None:
        barrier.wait(10)
        for _ in range(6):
            try:
                make_task(auths[i % len(auths)])
            except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    threads = [threading.Thread(target=in_thread_db(lambda i=i: finisher(i))) for i in range(5)]
    threads += [threading.Thread(target=in_thread_db(lambda i=i: creator(i))) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    finished = AuditEvent.objects.filter(task_id__in=[t.task_id for t in tasks], action="task.completed")
    assert finished.count() == Task.objects.filter(pk__in=[t.pk for t in tasks], status="completed").count()
    assert finished.count() == len({e for e in finished.values_list("task_id", flat=True)})  # once each
    for tenant in tenants:
        live = Task.objects.filter(tenant=tenant).exclude(status__in=["completed", "failed", "cancelled"]).count()
        assert Tenant.objects.get(pk=tenant.pk).active_tasks == live
    assert quotas.recount_active_tasks() == 0  # every principal's counter was exact too


def _prepared_finishes() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%pub_stored%"])
        return int(cur.fetchone()[0])


def test_the_statement_is_prepared_once_per_connection_without_a_pooler(settings: Any) -> None:
    """Planning it cost as much as running it: directly against PostgreSQL the server keeps it
    prepared; behind a transaction pooler nothing is prepared (another server connection, or
    another client, could get the name)."""
    auth = make_auth()
    session = make_session(auth)
    settings.MCPTASKS = {**settings.MCPTASKS, "DB_POOLER": "transaction"}
    for _ in range(2):
        task = _claimed(make_task(auth, session))
        transitions.finish_runs(runs=[(task, Outcome(pk=task.pk, attempt=1, status="completed", result={}))])
    assert _prepared_finishes() == 0
    settings.MCPTASKS = {**settings.MCPTASKS, "DB_POOLER": "none"}
    for _ in range(3):
        task = _claimed(make_task(auth, session))
        assert transitions.finish_runs(runs=[(task, Outcome(pk=task.pk, attempt=1, status="completed",
                                                            result={"content": []}))]) == [True]
    assert _prepared_finishes() == 1
    assert Task.objects.filter(session_id=session.pk, status="completed").count() == 5


def _stored_tasks(template: Task, n: int, first: int) -> None:
    """``n`` completed tasks like ``template``, written at once (task ids ``stored-<first>``...)."""
    Task.objects.bulk_create([
        Task(tenant_id=template.tenant_id, principal_id=template.principal_id, session_id=template.session_id,
             tool_name=template.tool_name, params=template.params, created_at=template.created_at,
             last_updated_at=template.last_updated_at, ttl_ms=template.ttl_ms, status="completed",
             task_id=f"stored-{first + i}")
        for i in range(n)], batch_size=1000)


def test_a_batch_reads_its_own_rows_by_key_however_many_tasks_are_stored() -> None:
    """The plan the server keeps for the prepared statement (the generic plan, made while the
    table was small) still reads a few dozen pages of the task table and its indexes for a batch
    of two after 3,000 more tasks are stored: the runs' rows were found by joining the table to
    the batch, which that plan did by hashing every row (999 pages a call after half a minute of
    ``bench/e2e_load.py``)."""
    auth = make_auth()
    session = make_session(auth)
    template = _claimed(make_task(auth, session))
    _stored_tasks(template, 300, 0)
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {connection.ops.quote_name(Task._meta.db_table)}")
        cur.execute("SET plan_cache_mode = force_generic_plan")
    try:
        # The first batch makes the plan on the small table; the second runs it on the large one.
        for more in (0, 3000):
            runs = [_claimed(make_task(auth, session)) for _ in range(2)]
            _stored_tasks(template, more, 1000)
            outcomes = [Outcome(pk=t.pk, attempt=1, status="completed", result={"content": []}) for t in runs]
            with transaction.atomic():
                before = pages_fetched(Task)
                written = finishsql.finish(outcomes, now=timezone.now(), notes=[(None, None)] * len(outcomes))
                fetched = pages_fetched(Task) - before
            assert written is not None and sorted(written.won) == sorted(t.pk for t in runs)
    finally:
        with connection.cursor() as cur:
            cur.execute("RESET plan_cache_mode")
    assert fetched < 150, f"the finish of 2 runs asked for {fetched} pages of the task table and its indexes"
