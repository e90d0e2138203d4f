"""The worker's database rules, in-process (SQLite or PostgreSQL): claim, renew, reap, hand back."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from mcptasks.models import Outcome, Task, TaskStatus, tool_lock_key
from mcptasks.streams import events
from mcptasks.tasks.transitions import WORKER_LOST
from mcptasks.tools.registry import Registry
from mcptasks.worker.loop import Worker
from tests.support.factories import task_row

pytestmark = pytest.mark.django_db

reg = Registry()


@reg.tool(task_support="optional", retryable=True)
async def u_retry() -> str:
    return "ok"


@reg.tool(task_support="optional")
async def u_once() -> str:
    return "ok"


@reg.tool(task_support="optional", max_concurrency=2)
async def u_limited() -> str:
    return "ok"


def worker(name: str = "w1") -> Worker:
    return Worker(concurrency=4, worker_id=name, registry_=reg, run_cleanup=False)


def test_claim_stamps_attempt_worker_and_lease() -> None:
    t = task_row("u_retry", max_attempts=3)
    claimed = worker()._claim(10)
    assert [c.task_id for c in claimed] == [t.task_id]
    t.refresh_from_db()
    assert t.attempt == 1 and t.worker_id == "w1" and t.lease_expires_at > timezone.now()
    assert worker("w2")._claim(10) == []  # leased: nobody else gets it


def test_expired_lease_of_retryable_task_is_rerun_with_next_attempt() -> None:
    past = timezone.now() - dt.timedelta(seconds=1)
    t = task_row("u_retry", max_attempts=3, attempt=1, worker_id="dead", lease_expires_at=past)
    (c,) = worker("w2")._claim(10)
    assert c.attempt == 2 and c.worker_id == "w2"
    assert worker("w2")._reap_lost() == 0
    t.refresh_from_db()
    assert t.status == TaskStatus.WORKING


def test_expired_lease_of_last_attempt_fails_as_worker_lost() -> None:
    past = timezone.now() - dt.timedelta(seconds=1)
    t = task_row("u_once", attempt=1, worker_id="dead", lease_expires_at=past)
    assert worker()._claim(10) == []
    assert worker()._reap_lost() == 1
    t.refresh_from_db()
    assert t.status == TaskStatus.FAILED and t.status_message == WORKER_LOST
    assert t.error == {"code": -32603, "message": WORKER_LOST}


def test_live_lease_is_not_reaped() -> None:
    future = timezone.now() + dt.timedelta(seconds=30)
    t = task_row("u_once", attempt=1, worker_id="alive", lease_expires_at=future)
    assert worker()._reap_lost() == 0
    t.refresh_from_db()
    assert t.status == TaskStatus.WORKING


def test_hand_back_releases_at_once_without_using_an_attempt() -> None:
    t = task_row("u_once")
    w1 = worker("w1")
    (c,) = w1._claim(10)
    assert w1._release([(c.task_id, c.attempt)]) == 1
    t.refresh_from_db()
    assert t.lease_expires_at is None and t.worker_id is None and t.attempt == 1 and t.max_attempts == 2
    assert worker("w2")._reap_lost() == 0  # a handed-back task was never lost
    (again,) = worker("w2")._claim(10)
    assert again.attempt == 2  # a fresh attempt number: the interrupted run can't write
    # The old run's outcome is refused (WHERE attempt = ours).
    from mcptasks.tasks import transitions

    assert not transitions.transition(task=t, to=TaskStatus.COMPLETED, result={"content": []}, attempt=1)
    assert transitions.transition(task=t, to=TaskStatus.COMPLETED, result={"content": []}, attempt=2)


def test_renew_reports_cancelled_and_superseded_runs() -> None:
    w = worker("w1")
    a, b, c = (task_row("u_retry", max_attempts=3) for _ in range(3))
    claimed = {t.task_id: t.attempt for t in w._claim(10)}
    assert set(claimed) == {a.task_id, b.task_id, c.task_id}
    Task.objects.filter(pk=b.pk).update(cancel_requested=True, status=TaskStatus.CANCELLED)
    Task.objects.filter(pk=c.pk).update(attempt=2, worker_id="w2")  # taken over after a stall
    assert sorted(w._renew(claimed)) == sorted([b.task_id, c.task_id])


def test_claim_skips_tasks_already_running_here() -> None:
    past = timezone.now() - dt.timedelta(seconds=1)
    t = task_row("u_retry", max_attempts=3, attempt=1, worker_id="w1", lease_expires_at=past)
    w = worker("w1")
    w.running[t.task_id] = (None, None, 1)  # type: ignore[assignment]
    assert w._claim(10) == []


def test_max_concurrency_counts_live_leases_of_every_worker() -> None:
    future = timezone.now() + dt.timedelta(seconds=30)
    task_row("u_limited", attempt=1, worker_id="other", lease_expires_at=future)
    for _ in range(3):
        task_row("u_limited")
    other = task_row("u_once")
    claimed = worker()._claim(10)
    names = sorted(t.tool_name for t in claimed)
    assert names == ["u_limited", "u_once"]  # one slot left of 2; other tools not held up
    assert other.task_id in {t.task_id for t in claimed}
    assert worker("w3")._claim(10) == []


def test_tool_lock_key_is_a_stable_int4() -> None:
    key = tool_lock_key("render_report")
    assert key == tool_lock_key("render_report") != tool_lock_key("other")
    assert -(2**31) <= key < 2**31


def test_progress_stops_at_terminal_status() -> None:
    """Progress notifications MUST stop after the task reaches a terminal status."""
    from asgiref.sync import async_to_sync

    from mcptasks.models import StreamEvent
    from mcptasks.tasks import transitions
    from mcptasks.tools.context import ToolCancelled
    from mcptasks.worker.backend import WorkerBackend

    task = task_row("u_once")
    Task.objects.filter(pk=task.pk).update(progress_token="tok", attempt=1)
    task.refresh_from_db()
    events.open_get_stream(session_id=task.session_id)  # where the progress goes (a client listens)
    backend = WorkerBackend(Worker(registry_=reg), task)
    async_to_sync(backend.progress)(1, 2, "half")
    assert StreamEvent.objects.filter(data__contains='"progressToken":"tok"').count() == 1
    assert transitions.transition(task=task, to=TaskStatus.COMPLETED, result={"content": []})
    with pytest.raises(ToolCancelled):
        async_to_sync(backend.progress)(2, 2, "done")
    assert StreamEvent.objects.filter(data__contains='"progressToken":"tok"').count() == 1
    assert backend.cancelled


@pytest.mark.django_db
def test_outcome_write_is_retried_through_a_database_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 11 item 5: a finished run is not reported lost because the database blinked."""
    import asyncio
    import types

    from django.db import OperationalError

    from mcptasks.tasks import transitions
    from mcptasks.worker.loop import Worker

    calls: list[int] = []

    def flaky_finish(*, runs: list[Any]) -> list[bool]:
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("the database system is shutting down")
        return [True] * len(runs)

    monkeypatch.setattr(transitions, "finish_runs", flaky_finish)
    worker = Worker(concurrency=1, run_cleanup=False)
    task: Any = types.SimpleNamespace(task_id="t-1", pk=1, attempt=1)  # only passed through
    outcome = Outcome(pk=1, attempt=1, status="completed", result={"content": []})
    ok = asyncio.run(worker._write_batch([(task, outcome)]))
    assert ok == [True] and len(calls) == 3


@pytest.mark.django_db
def test_claims_are_fair_across_tenants() -> None:
    """Issue 11 item 7: a tenant flooding the queue does not starve another tenant."""
    from mcptasks.worker.loop import Worker
    from tests.support.factories import make_auth, make_session, make_task

    flood, other = make_auth(), make_auth()
    flood_session, other_session = make_session(flood), make_session(other)
    for _ in range(20):
        make_task(flood, flood_session)
    late = [make_task(other, other_session).task_id for _ in range(2)]
    claimed = Worker(concurrency=4, run_cleanup=False)._claim(4)
    ids = [t.task_id for t in claimed]
    assert len(ids) == 4
    assert set(late) <= set(ids), "the other tenant's tasks waited behind the flood"


@pytest.mark.django_db
def test_plain_calls_take_a_quota_slot() -> None:
    """Issue 11 item 7: plain tools/call requests count against the concurrency quotas."""
    from mcptasks.models import Task
    from mcptasks.tasks import creation, transitions
    from tenants.models import Tenant
    from tenants.quotas import QuotaExceeded
    from tests.support.factories import demo_tool, make_auth, make_session, make_tenant

    tenant = make_tenant(max_concurrent_tasks=1)
    auth = make_auth(tenant)
    session = make_session(auth)
    first = creation.create_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1}, request_id=1,
                            progress_token=None, kind=Task.Kind.REQUEST, stream_id="p" + "1" * 16)
    assert Tenant.objects.get(pk=tenant.pk).active_tasks == 1
    with pytest.raises(QuotaExceeded):
        creation.create_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1}, request_id=2,
                        progress_token=None, kind=Task.Kind.REQUEST, stream_id="p" + "2" * 16)
    transitions.transition(task=first, to="completed", result={"content": []})
    assert Tenant.objects.get(pk=tenant.pk).active_tasks == 0


@pytest.mark.django_db
def test_a_batch_of_outcomes_writes_only_current_live_runs() -> None:
    """Issue 14: many outcomes in one transaction, each with the rules of a single transition."""
    from mcptasks.models import AuditEvent, Task
    from mcptasks.tasks import transitions
    from tenants.models import Principal, Tenant
    from tests.support.factories import make_auth, make_session, make_task

    auth = make_auth()
    session = make_session(auth)
    done, failed, superseded, cancelled = (make_task(auth, session) for _ in range(4))
    Task.objects.filter(pk__in=[done.pk, failed.pk, cancelled.pk]).update(attempt=1)
    Task.objects.filter(pk=superseded.pk).update(attempt=2)  # another run took it over
    assert transitions.cancel_task(auth=auth, task_id=cancelled.task_id).status == "cancelled"
    for t in (done, failed, superseded, cancelled):
        t.refresh_from_db()
    runs = [
        (done, Outcome(pk=done.pk, attempt=1, status="completed",
                       result={"content": [{"type": "text", "text": "ok"}]})),
        (failed, Outcome(pk=failed.pk, attempt=1, status="failed", message="boom",
                         error={"code": -32603, "message": "boom"})),
        (superseded, Outcome(pk=superseded.pk, attempt=1, status="completed", result={"content": []})),
        (cancelled, Outcome(pk=cancelled.pk, attempt=1, status="completed", result={"content": []})),
    ]
    assert transitions.finish_runs(runs=runs) == [True, True, False, False]
    rows = {t.pk: t for t in Task.objects.filter(pk__in=[r[0].pk for r in runs])}
    assert rows[done.pk].status == "completed" and rows[done.pk].result["content"][0]["text"] == "ok"
    assert rows[done.pk].finished_at is not None and rows[done.pk].lease_expires_at is None
    assert rows[failed.pk].status == "failed" and rows[failed.pk].status_message == "boom"
    assert rows[failed.pk].error == {"code": -32603, "message": "boom"} and rows[failed.pk].result is None
    assert rows[superseded.pk].status == "working" and rows[superseded.pk].result is None
    assert rows[cancelled.pk].status == "cancelled" and rows[cancelled.pk].result is None
    # Slots: 4 taken, 1 given back by the cancel, 2 by the batch; the superseded run holds its own.
    assert Tenant.objects.get(pk=auth.tenant_id).active_tasks == 1
    assert Principal.objects.get(pk=auth.principal_id).active_tasks == 1
    actions = set(AuditEvent.objects.filter(task_id__in=[done.task_id, failed.task_id])
                  .values_list("task_id", "action"))
    assert {(done.task_id, "task.completed"), (failed.task_id, "task.failed")} <= actions


@pytest.mark.django_db
def test_a_refused_creation_leaves_no_task_and_no_audit_row() -> None:
    """The slot is taken last in the creation's transaction: a refusal rolls back what came before it."""
    from mcptasks.models import AuditEvent, Task
    from mcptasks.tasks import creation
    from tenants.quotas import QuotaExceeded
    from tests.support.factories import demo_tool, make_auth, make_session, make_tenant

    tenant = make_tenant(max_concurrent_tasks=1)
    auth = make_auth(tenant)
    session = make_session(auth)
    creation.create_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1}, request_id=1,
                    progress_token=None)
    with pytest.raises(QuotaExceeded):
        creation.create_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1}, request_id=2,
                        progress_token=None)
    assert Task.objects.filter(tenant_id=tenant.pk).count() == 1
    assert AuditEvent.objects.filter(tenant_id=tenant.pk, action="task.create").count() == 1


def test_progress_is_saved_on_the_task_at_most_once_a_second_and_before_the_outcome() -> None:
    """The console's task page reads ``Task.progress``: saved with or without a progress token."""
    from asgiref.sync import async_to_sync

    from mcptasks.worker.backend import WorkerBackend

    task = task_row("u_once")
    Task.objects.filter(pk=task.pk).update(attempt=1)  # no progress token: no notifications
    task.refresh_from_db()
    backend = WorkerBackend(Worker(registry_=reg), task)
    async_to_sync(backend.progress)(1, 10, "one")
    assert Task.objects.get(pk=task.pk).progress == {"progress": 1, "total": 10, "message": "one"}
    async_to_sync(backend.progress)(2, 10, "two")  # within the second: held back
    assert Task.objects.get(pk=task.pk).progress["progress"] == 1
    async_to_sync(backend.flush_progress)()  # before the outcome: the latest is written
    assert Task.objects.get(pk=task.pk).progress == {"progress": 2, "total": 10, "message": "two"}


def test_claim_records_when_the_task_first_started() -> None:
    task = task_row("u_retry")
    now = timezone.now()
    w = worker()
    [claimed] = Task.objects.claim(worker_id=w.worker_id, limit=1, now=now, lease_until=now + dt.timedelta(seconds=30))
    assert Task.objects.get(pk=task.pk).started_at == now
    # A later attempt keeps the first start (queued time is until the first claim).
    Task.objects.filter(pk=task.pk).update(lease_expires_at=now - dt.timedelta(seconds=1), max_attempts=3)
    later = now + dt.timedelta(seconds=60)
    Task.objects.claim(worker_id="w2", limit=1, now=later, lease_until=later + dt.timedelta(seconds=30))
    assert Task.objects.get(pk=task.pk).attempt == 2 and Task.objects.get(pk=task.pk).started_at == now
    assert claimed.pk == task.pk


@pytest.mark.parametrize("deliveries", [0, 2])
def test_the_webhook_sender_is_woken_only_by_batches_that_wrote_deliveries(
    monkeypatch: pytest.MonkeyPatch, deliveries: int
) -> None:
    """A claim query per finished batch for nothing (no endpoint) was ~10 % of a busy worker."""
    import types

    from mcptasks.tasks import transitions
    from mcptasks.worker.loop import Worker

    def finish(*, runs: list[Any]) -> transitions.Finished:
        done = transitions.Finished([True] * len(runs))
        done.deliveries = deliveries
        return done

    monkeypatch.setattr(transitions, "finish_runs", finish)
    worker = Worker(concurrency=1, run_cleanup=False)
    worker._webhooks = types.SimpleNamespace(wake=asyncio.Event())  # type: ignore[assignment]
    task: Any = types.SimpleNamespace(task_id="t-1", pk=1, attempt=1)
    outcome = Outcome(pk=1, attempt=1, status="completed", result={"content": []})

    async def go() -> None:
        await worker._finish(task, outcome)

    asyncio.run(go())
    assert worker._webhooks.wake.is_set() is (deliveries > 0)


class _ScriptedLayer:
    """A channel layer whose receive hands out scripted messages, then waits forever."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self.drained = asyncio.Event()

    async def receive(self, channel: str) -> dict[str, Any]:
        if self.messages:
            return self.messages.pop(0)
        self.drained.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_cancel_racing_a_returned_tool_costs_no_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel that arrives while a returned run's outcome is being written has nothing left to
    stop: no database read, no "cancelled or superseded" line. A run still working is checked
    on a cancel (and only then: "changed" signals are not for workers)."""
    from mcptasks.worker.backend import WorkerBackend

    w = worker()
    w.channel = "me"
    checks: list[str] = []

    async def spy_check_cancel(task_id: str) -> None:
        checks.append(task_id)

    monkeypatch.setattr(w, "_check_cancel", spy_check_cancel)
    finished = Task(task_id="t-finished", tool_name="u_once", attempt=1)
    running = Task(task_id="t-running", tool_name="u_once", attempt=1)
    for t, finishing in ((finished, True), (running, False)):
        backend = WorkerBackend(w, t)
        backend.finishing = finishing
        w.running[t.task_id] = (asyncio.get_running_loop().create_future(), backend, 1)
    layer = _ScriptedLayer([
        {"type": "task.signal", "task_id": "t-finished", "event": "cancel"},
        {"type": "task.signal", "task_id": "t-running", "event": "changed", "status": "working"},
        {"type": "task.signal", "task_id": "t-running", "event": "cancel"},
    ])
    loop_task = asyncio.ensure_future(w._receive_loop(layer))
    try:
        await asyncio.wait_for(layer.drained.wait(), timeout=5)
        await asyncio.sleep(0)
    finally:
        loop_task.cancel()
    # The finished run is left alone; a run still working is checked (a cancel must stop it).
    assert checks == ["t-running"]


def test_a_claim_in_the_database_thread_reads_no_live_run_table() -> None:
    """The claim runs in the database thread while the event loop starts and ends runs: it takes
    a snapshot made on the loop, never ``self.running`` itself ("dictionary changed size during
    iteration" skipped a claim round in the soak)."""

    class Mutating(dict[str, Any]):
        def __iter__(self) -> Any:
            raise RuntimeError("dictionary changed size during iteration")

        def values(self) -> Any:
            raise RuntimeError("dictionary changed size during iteration")

    t = task_row("u_retry", max_attempts=3)
    w = worker()
    w.running = Mutating()
    claimed = w._claim(10, running=[], tenant_running={})
    assert [c.task_id for c in claimed] == [t.task_id]


async def test_a_run_whose_tool_returned_frees_its_slot_before_its_outcome_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 27: the slot is for running tools. A run whose tool has returned only waits for the
    batch writer; holding its slot until the outcome and its notifications were written kept
    slots idle for several times a 50 ms tool's run under load while tasks waited to be claimed."""
    from mcptasks.worker.backend import WorkerBackend

    w = Worker(concurrency=1, worker_id="w-slot", registry_=reg, run_cleanup=False)
    written = asyncio.Event()

    async def tool_returns(task: Task, backend: WorkerBackend) -> Outcome:
        return Outcome(pk=1, attempt=1, status="completed", result={"content": []})

    async def slow_write(task: Task, outcome: Outcome) -> None:
        await written.wait()  # the batch writer is busy (or the database slow)

    monkeypatch.setattr(w, "_run", tool_returns)
    monkeypatch.setattr(w, "_finish", slow_write)
    task = Task(task_id="t-slot", tool_name="u_once", attempt=1, tenant_id=7)
    backend = WorkerBackend(w, task)
    w.running[task.task_id] = (asyncio.get_running_loop().create_future(), backend, 1)
    assert w._free_slots() == 0 and w._busy_by_tenant() == {7: 1}  # its tool runs: the slot is taken

    run = asyncio.ensure_future(w._execute(task, backend))
    await asyncio.wait_for(w.wake.wait(), timeout=5)  # the loop is told to claim again at once
    assert not run.done(), "the outcome is still being written"
    assert w._free_slots() == 1 and w._busy_by_tenant() == {}
    written.set()
    await asyncio.wait_for(run, timeout=5)


async def _wakes_of_two_runs(monkeypatch: pytest.MonkeyPatch, *, backlog: bool, burst: bool = False,
                             tool: str = "u_once") -> tuple[list[str], list[str]]:
    """Two runs of ``tool`` in a worker whose last claim round left ``backlog``: the wake-ups of
    the loop while the long one still runs (the short one ended), and after both ended."""
    w = Worker(concurrency=2, worker_id="w-wakes", registry_=reg, run_cleanup=False, burst=burst)
    w._backlog = backlog
    gate = asyncio.Event()
    wakes: list[str] = []

    class Counting(asyncio.Event):
        def set(self) -> None:
            wakes.append("wake")
            super().set()

    async def run(task: Task, backend: Any) -> Outcome:
        if task.task_id == "t-long":
            await gate.wait()
        return Outcome(pk=1, attempt=1, status="completed", result={"content": []})

    async def finish(task: Task, outcome: Outcome) -> None:
        await asyncio.sleep(0)

    async def settle(until: Any) -> None:
        for _ in range(100):
            if until():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)

    w.wake = Counting()
    monkeypatch.setattr(w, "_run", run)
    monkeypatch.setattr(w, "_finish", finish)
    w._start(Task(task_id="t-long", tool_name=tool, attempt=1, tenant_id=7))
    w._start(Task(task_id="t-short", tool_name=tool, attempt=1, tenant_id=7))
    await settle(lambda: "t-short" not in w.running)
    assert "t-short" not in w.running and "t-long" in w.running
    first = list(wakes)
    gate.set()
    await settle(lambda: not w.running)
    assert not w.running
    return first, wakes


async def test_a_returned_run_wakes_the_claim_loop_once_when_tasks_may_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a backlog (the last claim round filled its slots), a run whose tool returned wakes the
    loop when its slot frees, not again when its outcome is written: with an empty queue that
    second claim found nothing, one wasted claim statement per task."""
    first, after = await _wakes_of_two_runs(monkeypatch, backlog=True)
    assert first == ["wake"], "the short run should wake the loop once, when its tool returned"
    assert after == ["wake"] * 2  # the long run: when its tool returned, and not again


async def test_a_returned_run_claims_nothing_when_no_task_waits_unannounced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27: when the last claim round found fewer tasks than free slots, every waiting task
    was claimed and each new one wakes the workers itself: a run that ends wakes nobody. Before,
    each run's end (and each last run's end) cost a claim that found nothing: 2.5 claim statements
    per task at one creating client with two workers (bench/RESULTS.md)."""
    first, after = await _wakes_of_two_runs(monkeypatch, backlog=False)
    assert first == [] and after == []


async def test_a_burst_worker_is_woken_when_its_last_run_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``--burst`` worker checks whether it is done when nothing runs any more."""
    first, after = await _wakes_of_two_runs(monkeypatch, backlog=False, burst=True)
    assert first == [] and after == ["wake"]


async def test_the_end_of_a_limited_tools_run_wakes_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool with ``max_concurrency`` has a slot free in every worker's count only once the run's
    outcome is written: its waiting tasks are claimed then, by the worker whose run ended."""
    first, after = await _wakes_of_two_runs(monkeypatch, backlog=False, tool="u_limited")
    assert first == ["wake"] and after == ["wake"] * 2


@pytest.mark.parametrize(("asked", "claimed", "passed_over", "running", "backlog"), [
    (4, 1, False, 0, False),  # fewer than asked, nothing passed over: nothing was left behind
    (4, 1, True, 0, True),    # fewer than asked, but rows it saw were locked by another claim
    (4, 4, False, 0, True),   # every slot filled: more may wait
    (0, 0, False, 0, True),   # no slot free when woken: the wake-up went unserved
    (1, 0, False, 3, True),   # the tenant is at its cap here (concurrency 4, one slot reserved)
])
def test_a_claim_round_notes_whether_tasks_may_wait_unannounced(
    asked: int, claimed: int, passed_over: bool, running: int, backlog: bool
) -> None:
    from mcptasks.models import Claimed
    from mcptasks.worker.loop import _tenant_cap, tasks_may_wait

    cap = _tenant_cap(4)
    assert cap == 3
    got = Claimed(Task(task_id=f"t{i}") for i in range(claimed))
    got.passed_over = passed_over
    assert tasks_may_wait(asked=asked, claimed=got, busy={7: running} if running else {}, cap=cap) is backlog


async def test_announcements_within_the_claim_delay_wake_the_claim_loop_once(settings: Any) -> None:
    """Issue 27: every new task is announced to every worker. Within ``WORKER_CLAIM_DELAY_S`` of
    the first announcement the others join it: one claim for the burst, made after the creating
    requests were answered (at one creating client, two claims per task ran while the creation
    waited, doubling its latency)."""
    settings.MCPTASKS = {**settings.MCPTASKS, "WORKER_CLAIM_DELAY_S": 0.05}
    w = Worker(concurrency=2, worker_id="w-delay", registry_=reg, run_cleanup=False)
    fired: list[float] = []
    loop = asyncio.get_running_loop()
    w.announce.fire = lambda: fired.append(loop.time())
    start = loop.time()
    for _ in range(3):
        w.announce()
        await asyncio.sleep(0.01)
    assert fired == []  # still within the delay
    await asyncio.sleep(0.08)
    assert len(fired) == 1 and fired[0] - start >= 0.045
    w.announce()  # a later burst gets a claim of its own
    await asyncio.sleep(0.08)
    assert len(fired) == 2
    w.announce()
    w.announce.cancel()  # a stopping worker leaves no timer behind
    await asyncio.sleep(0.08)
    assert len(fired) == 2


async def test_without_a_claim_delay_an_announcement_wakes_the_loop_at_once(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "WORKER_CLAIM_DELAY_S": 0}
    w = Worker(concurrency=2, worker_id="w-now", registry_=reg, run_cleanup=False)
    w.announce()
    assert w.wake.is_set()


@pytest.mark.django_db(transaction=True)
async def test_a_claim_that_passed_over_rows_with_slots_free_looks_again(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Issue 27: a claim racing others gets fewer rows than it asked for while rows remain (they
    were locked by a claim that kept only some). The worker took that for an empty queue and
    idled until its poll while thousands of tasks waited (one of four workers ran none of 3,000).
    It now claims again after the claim delay, until a claim passes over nothing."""
    from mcptasks.db import wakeups
    from mcptasks.models import Claimed

    settings.MCPTASKS = {**settings.MCPTASKS, "WORKER_POLL_S": 30, "WORKER_CLAIM_DELAY_S": 0.02}
    w = Worker(concurrency=4, worker_id="w-passed", registry_=reg, run_cleanup=False)
    claims: list[int] = []

    def claim(limit: int, **_kw: Any) -> Claimed:
        claims.append(limit)
        found = Claimed()
        found.passed_over = len(claims) <= 3
        return found

    async def no_wakeups() -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(w, "_claim", claim)
    monkeypatch.setattr(w, "_listen", no_wakeups)  # only the claims themselves may wake the loop
    monkeypatch.setattr(wakeups, "via_postgres", lambda: False)
    stop = asyncio.Event()
    runner = asyncio.ensure_future(w.run(stop))
    try:
        for _ in range(100):
            if len(claims) >= 4:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        await asyncio.wait_for(runner, 20)
    # Three claims passed over rows, so each was followed by another; the fourth saw nothing
    # left and the loop waits for a wake-up or its poll.
    assert claims == [4, 4, 4, 4]

    # A --burst worker exits once nothing is runnable: not while another claim holds rows.
    claims.clear()
    burst = Worker(concurrency=4, worker_id="w-burst", registry_=reg, run_cleanup=False, burst=True)
    monkeypatch.setattr(burst, "_claim", claim)
    monkeypatch.setattr(burst, "_listen", no_wakeups)
    await asyncio.wait_for(burst.run(asyncio.Event()), 20)
    assert claims == [4, 4, 4, 4]


@pytest.mark.django_db(transaction=True)
async def test_a_worker_opts_out_of_wake_ups_while_its_slots_stay_full_and_back_in_when_the_queue_empties(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 27: every notifying commit takes PostgreSQL's global notify lock, so a worker whose
    claims keep finding a backlog stops asking (mcptasks.db.wakeups). It asks again after the
    first claim that leaves the queue empty, and claims once more at once: a creation that read
    the flags before it asked is then either seen by that claim or checked after its commit."""
    from asgiref.sync import sync_to_async

    from mcptasks.models import WorkerHeartbeat
    from mcptasks.worker import rows
    from mcptasks.worker import wakeup_optin as worker_loop

    w = Worker(concurrency=2, worker_id="w-wants", registry_=reg, run_cleanup=False)
    await sync_to_async(rows.worker_heartbeat)(worker_id="w-wants", hostname="h", pid=1, concurrency=2, running=0)

    async def asks() -> bool:
        return await sync_to_async(lambda: WorkerHeartbeat.objects.get(pk="w-wants").wants_wakeups)()

    assert await asks()  # a new worker asks
    w._backlog = True
    await w._want_wakeups()
    assert await asks()  # a backlog only just found
    monkeypatch.setattr(worker_loop, "WAKEUP_OPT_OUT_S", 0.0)
    await w._want_wakeups()
    assert not await asks()
    w.wake.clear()
    w._backlog = False
    await w._want_wakeups()
    assert await asks() and w.wake.is_set()
    w.wake.clear()
    await w._want_wakeups()  # already asking: nothing written, no extra claim
    assert not w.wake.is_set()
    # A row removed under it (the cleanup of a worker it took for dead) is written again.
    await sync_to_async(WorkerHeartbeat.objects.filter(pk="w-wants").delete)()
    w._backlog = True
    await w._want_wakeups()
    assert w._wants_wakeups is None
    w._backlog = False
    w.wake.clear()
    await w._want_wakeups()
    assert w._wants_wakeups is None and not w.wake.is_set()  # no claim loop spinning on a missing row


@pytest.mark.django_db(transaction=True)
async def test_a_tenant_at_its_cap_when_claimed_stays_a_backlog_though_its_runs_return_meanwhile(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Issue 27: with one tenant holding the tenant cap, a claim gets nothing of its tasks. If
    the tenant's runs returned while the claim ran, the worker read its runs again, found the
    tenant under the cap, and took the tenant's backlog for an empty queue: it stopped claiming
    as runs returned and asked for NOTIFY wake-ups, flapping every few seconds under load.
    The cap is now judged by the runs the claim counted."""
    from mcptasks.db import wakeups
    from mcptasks.models import Claimed

    settings.MCPTASKS = {**settings.MCPTASKS, "WORKER_POLL_S": 30, "WORKER_TENANT_RESERVED_SLOTS": 1}
    w = Worker(concurrency=8, worker_id="w-capped", registry_=reg, run_cleanup=False)
    stop = asyncio.Event()
    counted: list[dict[int, int]] = []
    readings = iter([{7: 7}])  # when the claim starts: tenant 7 holds 7 of 8 slots, its cap

    def claim(limit: int, **kw: Any) -> Claimed:
        counted.append(kw["tenant_running"])
        stop.set()
        return Claimed()  # the tenant is capped: nothing, and no row passed over

    async def no_wakeups() -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(w, "_busy_by_tenant", lambda: next(readings, {}))  # its runs have returned since
    monkeypatch.setattr(w, "_claim", claim)
    monkeypatch.setattr(w, "_listen", no_wakeups)
    monkeypatch.setattr(wakeups, "via_postgres", lambda: False)
    await asyncio.wait_for(w.run(stop), 20)
    assert counted == [{7: 7}]
    assert w._backlog  # the capped tenant's tasks still wait: a returned run claims again
