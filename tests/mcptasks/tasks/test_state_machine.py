"""The task state machine (transitions.transition) under concurrency, on the real database.

The spec's lifecycle: working -> input_required | completed | failed | cancelled;
input_required -> working | completed | failed | cancelled; terminal is final. transition() is
one conditional UPDATE, so whatever the interleaving, no illegal transition can be stored.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcptasks.models import Task, TaskStatus
from mcptasks.protocol.messages import TERMINAL_STATUSES, can_transition
from mcptasks.tasks import transitions
from tenants.models import Principal
from tests.support.factories import make_auth, make_session, make_task
from tests.support.requirements import require_postgres

STATUSES = [s.value for s in TaskStatus]
TERMINAL = {s.value for s in TERMINAL_STATUSES}


# --- deterministic: the transition table, on SQLite and PostgreSQL ----------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("src", STATUSES)
@pytest.mark.parametrize("dst", STATUSES)
def test_transition_applies_exactly_the_spec_table(src: str, dst: str) -> None:
    auth = make_auth()
    task = make_task(auth)
    Task.objects.filter(pk=task.pk).update(status=src)
    task.refresh_from_db()
    changed = transitions.transition(task=task, to=dst)
    stored = Task.objects.get(pk=task.pk).status
    assert changed == can_transition(src, dst)
    assert stored == (dst if changed else src)


@pytest.mark.django_db
def test_late_completion_never_overwrites_cancelled() -> None:
    auth = make_auth()
    task = make_task(auth)
    # The worker's view of the task, loaded while it was working.
    Task.objects.filter(pk=task.pk).update(attempt=1, worker_id="w1")
    stale = Task.objects.get(pk=task.pk)
    cancelled = transitions.cancel_task(auth=auth, task_id=task.task_id)
    assert cancelled.status == TaskStatus.CANCELLED
    for status in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED):
        assert not transitions.transition(
            task=stale, to=status, result={"content": [{"type": "text", "text": "late"}]}, attempt=stale.attempt
        )
    row = Task.objects.get(pk=task.pk)
    assert row.status == TaskStatus.CANCELLED
    assert row.result is None and row.error is None
    assert row.status_message == transitions.CANCELLED_MESSAGE
    # The quota slot was released once, by the cancellation.
    assert Principal.objects.get(pk=auth.principal_id).active_tasks == 0


@pytest.mark.django_db
def test_outcome_of_superseded_attempt_is_discarded() -> None:
    auth = make_auth()
    task = make_task(auth)
    Task.objects.filter(pk=task.pk).update(attempt=2)
    assert not transitions.transition(task=task, to=TaskStatus.COMPLETED, result={"content": []}, attempt=1)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.WORKING
    assert transitions.transition(task=task, to=TaskStatus.COMPLETED, result={"content": []}, attempt=2)


# --- Hypothesis: concurrent transitions on PostgreSQL -----------------------------------------

AUDIT_SQL = """
CREATE TABLE IF NOT EXISTS test_task_status_audit (
    id bigserial PRIMARY KEY, task_seq bigint NOT NULL, old_status text NOT NULL, new_status text NOT NULL
);
CREATE OR REPLACE FUNCTION test_task_status_audit_fn() RETURNS trigger AS $$
BEGIN
    INSERT INTO test_task_status_audit (task_seq, old_status, new_status) VALUES (OLD.seq, OLD.status, NEW.status);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS test_task_status_audit_tr ON mcptasks_task;
CREATE TRIGGER test_task_status_audit_tr AFTER UPDATE OF status ON mcptasks_task
    FOR EACH ROW EXECUTE FUNCTION test_task_status_audit_fn();
"""


@pytest.fixture
def status_audit(transactional_db: None) -> Iterator[None]:
    """A database trigger that records every stored status update (old -> new) of every task."""
    require_postgres()
    with connection.cursor() as cur:
        cur.execute(AUDIT_SQL)
    yield
    with connection.cursor() as cur:
        cur.execute("DROP TRIGGER IF EXISTS test_task_status_audit_tr ON mcptasks_task;"
                    "DROP TABLE IF EXISTS test_task_status_audit;")


def _audit(task_seq: int) -> list[tuple[str, str]]:
    with connection.cursor() as cur:
        cur.execute("SELECT old_status, new_status FROM test_task_status_audit WHERE task_seq = %s ORDER BY id",
                    [task_seq])
        return [(r[0], r[1]) for r in cur.fetchall()]


plans = st.lists(st.lists(st.sampled_from(STATUSES), min_size=1, max_size=4), min_size=2, max_size=5)


@pytest.mark.django_db(transaction=True)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=plans, start=st.sampled_from([TaskStatus.WORKING.value, TaskStatus.INPUT_REQUIRED.value]))
def test_concurrent_transitions_never_store_an_illegal_transition(
    status_audit: None, plan: list[list[str]], start: str
) -> None:
    auth = make_auth()
    task = make_task(auth, make_session(auth))
    if start != TaskStatus.WORKING:
        assert transitions.transition(task=task, to=start)
    successes: list[tuple[str, bool]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(plan))
    errors: list[BaseException] = []

    def run(targets: list[str]) -> None:
        try:
            barrier.wait(10)
            for to in targets:
                # Each call works on its own (possibly stale) copy, like separate processes would.
                mine = Task.objects.get(pk=task.pk)
                ok = transitions.transition(task=mine, to=to, status_message=f"-> {to}")
                with lock:
                    successes.append((to, ok))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(targets,)) for targets in plan]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors

    history = _audit(task.pk)
    if start != TaskStatus.WORKING:
        assert history[0] == ("working", start)
        history = history[1:]
    # Every stored change is a legal one; nothing follows a terminal status.
    for old, new in history:
        assert can_transition(old, new), f"illegal stored transition {old} -> {new}: {history}"
    # The stored history is a chain, and each successful call is exactly one stored change.
    for (_o1, n1), (o2, _n2) in zip(history, history[1:], strict=False):
        assert n1 == o2
    assert len(history) == sum(1 for _to, ok in successes if ok)
    final = Task.objects.get(pk=task.pk)
    assert final.status == (history[-1][1] if history else start)
    terminal_changes = [new for _old, new in history if new in TERMINAL]
    assert len(terminal_changes) <= 1
    if terminal_changes:
        assert history[-1][1] == terminal_changes[0]
        assert final.finished_at is not None
    # The concurrency slot is held exactly while the task is live.
    live = Task.objects.filter(principal_id=auth.principal_id).exclude(status__in=TERMINAL).count()
    assert Principal.objects.get(pk=auth.principal_id).active_tasks == live


