"""Durable execution across real processes: SIGKILL, SIGTERM, cancellation, limits, throughput.

Every test starts its own ``mcptasks_worker`` subprocesses (and daphne processes) on one
PostgreSQL database and one Redis, so it needs both (``require_multiprocess()`` skips with the
reason otherwise). The ``mcptasks.testing`` tools write a database-side counter (``RunRecord``:
start/end/stopped events per task key and attempt) that the assertions read directly.
Fast settings from tests/support/servers.py apply: heartbeat 0.5 s, lease 3 s, poll 0.5 s.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.client import McpClient
from tests.support.requirements import require_multiprocess
from tests.support.servers import FAST_SETTINGS, Proc, Stack
from tests.support.waiting import wait_for

HEARTBEAT_S = float(FAST_SETTINGS["MCPTASKS_WORKER_HEARTBEAT_S"])
LEASE_S = float(FAST_SETTINGS["MCPTASKS_WORKER_LEASE_S"])
TERMINAL = {"completed", "failed", "cancelled"}
WORKER_LOST = "worker lost during execution"


@pytest.fixture(scope="module")
def mp(stack: Stack) -> Iterator[Stack]:
    """The shared stack, only when several processes can share it."""
    require_multiprocess()
    yield stack


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts; whatever is still alive afterwards is stopped."""
    started: list[Proc] = []
    yield started
    for p in started:
        if p.alive:
            p.kill()


@pytest.fixture(scope="module")
def daphne_a(mp: Stack) -> Iterator[Proc]:
    """A daphne process that never runs tools."""
    proc = mp.daphne(embedded_worker=False)
    yield proc
    proc.terminate(timeout=10)


@pytest.fixture(scope="module")
def daphne_b(mp: Stack) -> Iterator[Proc]:
    """A second daphne process that never runs tools."""
    proc = mp.daphne(embedded_worker=False)
    yield proc
    proc.terminate(timeout=10)


def sql(stack: Stack, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run a query on the stack's database from the test process."""
    import psycopg

    with psycopg.connect(stack.env["DATABASE_URL"], autocommit=True) as conn:
        cur = conn.execute(query, params)
        return list(cur.fetchall()) if cur.description else []


def records(stack: Stack, key: str) -> list[tuple[int, str, dt.datetime]]:
    """(attempt, event, at) of a task key, in time order."""
    rows = sql(stack, "SELECT attempt, event, at FROM mcptasks_testing_runrecord WHERE task_key = %s ORDER BY at, id",
               (key,))
    return [(int(a), str(e), at) for a, e, at in rows]


def task_row(stack: Stack, task_id: str) -> dict[str, Any]:
    cols = ["status", "status_message", "attempt", "max_attempts", "worker_id", "lease_expires_at", "result"]
    rows = sql(stack, f"SELECT {', '.join(cols)} FROM mcptasks_task WHERE task_id = %s", (task_id,))
    assert rows, task_id
    return dict(zip(cols, rows[0], strict=True))


def wait_terminal(client: McpClient, task_id: str, timeout: float = 20.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        task = client.request("tasks/get", {"taskId": task_id}).result
        return task if task["status"] in TERMINAL else None

    return wait_for(f"task {task_id} to end", check, timeout, every=0.1)  # type: ignore[no-any-return]


def worker_id_of(proc: Proc) -> str:
    line = next(x for x in proc.log_text().splitlines() if "running (concurrency" in x)
    return line.split("worker ", 1)[1].split(" running", 1)[0]


def assert_attempts_exclusive(stack: Stack, key: str) -> None:
    """Each attempt number started once, and no attempt started while an earlier one was running."""
    recs = records(stack, key)
    starts = [a for a, e, _ in recs if e == "start"]
    assert len(starts) == len(set(starts)), recs
    open_attempt: int | None = None
    for attempt, event, _at in recs:
        if event == "start":
            # An earlier attempt may only be open if it never ended (its worker died or handed it back).
            assert open_attempt is None or not any(
                a == open_attempt and e in ("end",) for a, e, _ in recs
            ), f"attempt {attempt} of {key} started while attempt {open_attempt} was running: {recs}"
            open_attempt = attempt
        elif event in ("end", "stopped") and attempt == open_attempt:
            open_attempt = None


def new_client(proc: Proc) -> McpClient:
    c = McpClient(proc.url)
    c.initialize()
    return c


# --- crash recovery -------------------------------------------------------------------------------


def test_sigkill_mid_task_retryable_rerun_and_nonretryable_failed(
    mp: Stack, daphne_a: Proc, procs: list[Proc]
) -> None:
    w1 = mp.worker(concurrency=4)
    procs.append(w1)
    k_retry, k_once = "kill-r-" + secrets.token_hex(3), "kill-o-" + secrets.token_hex(3)
    with new_client(daphne_a) as client:
        t_retry = client.call_task("test_counted_retryable", {"key": k_retry, "ms": 4000})["taskId"]
        t_once = client.call_task("test_counted_once", {"key": k_once, "ms": 4000})["taskId"]
        wait_for("both tools to start in worker 1",
                 lambda: records(mp, k_retry) and records(mp, k_once))
        # SIGKILL first, while both 4 s runs are surely in progress: starting the second worker
        # first took over 4 s once on a loaded CI machine, and attempt 1 had finished by the kill.
        w1.kill()  # SIGKILL: no clean-up at all
        killed_at = time.monotonic()
        w2 = mp.worker(concurrency=4)
        procs.append(w2)
        startup = time.monotonic() - killed_at
        done_retry = wait_terminal(client, t_retry, timeout=max(LEASE_S, startup) + 10)
        done_once = wait_terminal(client, t_once, timeout=max(LEASE_S, startup) + 10)
        # Neither stayed working beyond the lease (or the new worker's start) plus one
        # heartbeat/poll and the run itself.
        assert time.monotonic() - killed_at < max(LEASE_S, startup) + 4 + 3
        assert done_retry["status"] == "completed", done_retry
        result = client.request("tasks/result", {"taskId": t_retry}).result
        assert result["content"][0]["text"] == f"done {k_retry} attempt 2"
        assert done_once["status"] == "failed", done_once
        assert done_once["statusMessage"] == WORKER_LOST
    assert [(a, e) for a, e, _ in records(mp, k_retry)] == [(1, "start"), (2, "start"), (2, "end")]
    assert [(a, e) for a, e, _ in records(mp, k_once)] == [(1, "start")]
    assert task_row(mp, t_retry)["worker_id"] == worker_id_of(w2)
    assert_attempts_exclusive(mp, k_retry)
    # The dead worker's heartbeat row stays (stale) for operators; the live one is fresh.
    rows = dict(sql(mp, "SELECT worker_id, last_seen_at FROM mcptasks_workerheartbeat"))
    assert worker_id_of(w1) in rows and worker_id_of(w2) in rows
    assert rows[worker_id_of(w2)] > rows[worker_id_of(w1)]


def test_two_workers_never_run_the_same_attempt(mp: Stack, daphne_a: Proc, procs: list[Proc]) -> None:
    w1, w2 = mp.worker(concurrency=8), mp.worker(concurrency=8)
    procs += [w1, w2]
    prefix = "race-" + secrets.token_hex(3)
    keys = [f"{prefix}-{i}" for i in range(24)]
    with new_client(daphne_a) as client:
        ids = [client.call_task("test_counted_retryable", {"key": k, "ms": 600})["taskId"] for k in keys]
        wait_for("some tools to start", lambda: sql(
            mp, "SELECT count(*) FROM mcptasks_testing_runrecord WHERE task_key LIKE %s", (prefix + "%",))[0][0] >= 6)
        w1.kill()  # its runs are re-run by w2 (and a fresh w3) once their leases lapse
        procs.append(mp.worker(concurrency=8))
        for tid in ids:
            assert wait_terminal(client, tid, timeout=LEASE_S + 20)["status"] == "completed"
    for key in keys:
        assert_attempts_exclusive(mp, key)
        recs = records(mp, key)
        # Retryable means at-least-once: a worker killed after its tool returned but before the
        # outcome was committed leaves an "end" that is not the task's outcome, and the task is
        # re-run. What must hold: attempts never overlap (above), and the run that completed the
        # task is the last attempt, which ended.
        ends = [a for a, e, _ in recs if e == "end"]
        assert ends and ends[-1] == max(a for a, _e, _ in recs), recs


def test_sigkill_with_fifty_tasks_in_flight_ends_each_exactly_once(
    mp: Stack, daphne_a: Proc, procs: list[Proc]
) -> None:
    """Issue 11 fault test: ~50 tasks in flight, a worker SIGKILLed; every task ends terminal once."""
    w1, w2 = mp.worker(concurrency=12), mp.worker(concurrency=12)
    procs += [w1, w2]
    prefix = "fifty-" + secrets.token_hex(3)
    with new_client(daphne_a) as client:
        tools = ["test_counted_retryable", "test_counted_once"]
        ids = {client.call_task(tools[i % 2], {"key": f"{prefix}-{i}", "ms": 1500})["taskId"]: i % 2 for i in range(50)}
        wait_for("tools to start in both workers", lambda: sql(
            mp, "SELECT count(DISTINCT worker_id) FROM mcptasks_task WHERE task_id = ANY(%s) AND worker_id IS NOT NULL",
            (list(ids),))[0][0] >= 2)
        w1.kill()
        finals = {tid: wait_terminal(client, tid, timeout=LEASE_S + 30) for tid in ids}
    for tid, once in ids.items():
        final = finals[tid]
        if once:
            assert final["status"] in ("completed", "failed"), final
            if final["status"] == "failed":
                assert final["statusMessage"] == WORKER_LOST, final
        else:
            assert final["status"] == "completed", final
    # Exactly one terminal transition each (the audit log records every one).
    rows = sql(mp, "SELECT task_id, count(*) FROM mcptasks_auditevent WHERE task_id = ANY(%s) "
                   "AND action IN ('task.completed', 'task.failed', 'task.cancelled') GROUP BY task_id", (list(ids),))
    assert dict(rows) == dict.fromkeys(ids, 1)


# --- SIGTERM --------------------------------------------------------------------------------------


def test_sigterm_finishes_short_runs_and_hands_back_long_ones(mp: Stack, daphne_a: Proc, procs: list[Proc]) -> None:
    w1 = mp.worker(concurrency=4, extra_env={"MCPTASKS_WORKER_SHUTDOWN_GRACE_S": "1.5"})
    procs.append(w1)
    w1_id = worker_id_of(w1)
    k_short, k_long = "term-s-" + secrets.token_hex(3), "term-l-" + secrets.token_hex(3)
    with new_client(daphne_a) as client:
        t_short = client.call_task("test_counted_once", {"key": k_short, "ms": 700})["taskId"]
        # Not retryable: a hand-back must not turn it into "worker lost".
        t_long = client.call_task("test_counted_once", {"key": k_long, "ms": 4000})["taskId"]
        wait_for("both tools to start", lambda: records(mp, k_short) and records(mp, k_long))
        terminated_at = time.monotonic()
        assert w1.terminate(timeout=15) == 0, w1.log_text()
        assert time.monotonic() - terminated_at < 1.5 + 2 + 2  # grace + cancel wait + exit
        assert client.request("tasks/get", {"taskId": t_short}).result["status"] == "completed"
        # Handed back: still working, lease and owner released at once, the attempt not counted.
        row = task_row(mp, t_long)
        assert row["status"] == "working" and row["lease_expires_at"] is None and row["worker_id"] is None, row
        assert row["attempt"] == 1 and row["max_attempts"] == 2, row
        w2 = mp.worker(concurrency=4)
        procs.append(w2)
        long = wait_terminal(client, t_long)
        assert long["status"] == "completed", long
        text = client.request("tasks/result", {"taskId": t_long}).result["content"][0]["text"]
        assert text == f"done {k_long} attempt 2"
    row = task_row(mp, t_long)
    assert row["attempt"] == 2 and row["max_attempts"] == 2 and row["worker_id"] == worker_id_of(w2)
    assert task_row(mp, t_short)["worker_id"] == w1_id
    assert [(a, e) for a, e, _ in records(mp, k_short)] == [(1, "start"), (1, "end")]
    assert [(a, e) for a, e, _ in records(mp, k_long)] == [(1, "start"), (2, "start"), (2, "end")]
    assert "handed back 1 tasks" in w1.log_text()
    # A clean exit removes the worker's heartbeat row.
    assert not sql(mp, "SELECT 1 FROM mcptasks_workerheartbeat WHERE worker_id = %s", (w1_id,))
    assert sql(mp, "SELECT 1 FROM mcptasks_workerheartbeat WHERE worker_id = %s", (worker_id_of(w2),))


def test_an_idle_worker_is_woken_by_the_creating_statement(mp: Stack, daphne_a: Proc, procs: list[Proc]) -> None:
    """With a 30 s poll, tasks created in one statement (after the tenant's first) are claimed
    at once: PostgreSQL delivers their NOTIFY to the worker's LISTEN with the commit."""
    procs.append(mp.worker(concurrency=2, extra_env={"MCPTASKS_WORKER_POLL_S": "30"}))
    with new_client(daphne_a) as client:
        for i in range(4):
            started = time.monotonic()
            tid = client.call_task("demo_sleep", {"ms": 10})["taskId"]
            assert wait_terminal(client, tid, timeout=10)["status"] == "completed"
            assert time.monotonic() - started < 3, f"task {i} waited for the poll"
        listeners = sql(mp, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND query = 'LISTEN mcptasks_wake'")
        assert listeners == [(1,)]


# --- cancellation ---------------------------------------------------------------------------------


def test_cancel_on_daphne_a_stops_tool_started_via_daphne_b_within_one_heartbeat(
    mp: Stack, daphne_a: Proc, daphne_b: Proc, procs: list[Proc]
) -> None:
    procs.append(mp.worker(concurrency=4))
    key = "cancel-" + secrets.token_hex(3)
    with new_client(daphne_b) as cb, new_client(daphne_a) as ca:
        tid = cb.call_task("test_cancellable", {"key": key, "ms": 10000})["taskId"]
        wait_for("the tool to start", lambda: records(mp, key))
        sent_at = dt.datetime.now(dt.UTC)
        reply = ca.request("tasks/cancel", {"taskId": tid})
        assert reply.result["status"] == "cancelled"
        stopped = wait_for("the tool to stop", lambda: [r for r in records(mp, key) if r[1] == "stopped"],
                           timeout=HEARTBEAT_S + 5)
        elapsed = (stopped[0][2] - sent_at).total_seconds()
        assert elapsed < HEARTBEAT_S + 0.5, f"tool stopped {elapsed:.3f}s after the cancel"
        assert cb.request("tasks/get", {"taskId": tid}).result["status"] == "cancelled"
    assert [e for _a, e, _ in records(mp, key)] == ["start", "stopped"]


def test_a_cancel_reaches_the_running_worker_through_its_own_group(
    mp: Stack, daphne_a: Proc, daphne_b: Proc, procs: list[Proc]
) -> None:
    """With a heartbeat of 20 s (the lease renewal that also reads the cancel flag), only the
    signal can stop the tool within a second: it goes to the group of the worker the task's row
    names (a worker joins no group per run)."""
    procs.append(mp.worker(concurrency=4, extra_env={"MCPTASKS_WORKER_HEARTBEAT_S": "20",
                                                     "MCPTASKS_WORKER_LEASE_S": "60"}))
    key = "signal-" + secrets.token_hex(3)
    with new_client(daphne_b) as cb, new_client(daphne_a) as ca:
        tid = cb.call_task("test_cancellable", {"key": key, "ms": 15000})["taskId"]
        wait_for("the tool to start", lambda: records(mp, key))
        sent_at = dt.datetime.now(dt.UTC)
        assert ca.request("tasks/cancel", {"taskId": tid}).result["status"] == "cancelled"
        stopped = wait_for("the tool to stop", lambda: [r for r in records(mp, key) if r[1] == "stopped"],
                           timeout=10)
        elapsed = (stopped[0][2] - sent_at).total_seconds()
        assert elapsed < 1.5, f"tool stopped {elapsed:.3f}s after the cancel"


def test_sync_tool_late_result_is_discarded(mp: Stack, daphne_a: Proc, procs: list[Proc]) -> None:
    w = mp.worker(concurrency=4)
    procs.append(w)
    key = "stubborn-" + secrets.token_hex(3)
    with new_client(daphne_a) as client:
        tid = client.call_task("test_stubborn", {"key": key, "ms": 1200})["taskId"]
        wait_for("the tool to start", lambda: records(mp, key))
        assert client.request("tasks/cancel", {"taskId": tid}).result["status"] == "cancelled"
        # The sync tool ignores ctx.cancelled and returns anyway ...
        wait_for("the tool to return", lambda: [r for r in records(mp, key) if r[1] == "end"], timeout=10)
        wait_for("the worker to let go of it", lambda: sql(
            mp, "SELECT running FROM mcptasks_workerheartbeat WHERE worker_id = %s", (worker_id_of(w),)) == [(0,)])
        # ... and its result is discarded: the task stays cancelled.
        assert client.request("tasks/get", {"taskId": tid}).result["status"] == "cancelled"
        err = client.request("tasks/result", {"taskId": tid}).error
        assert "cancel" in err["message"].lower()
    assert task_row(mp, tid)["result"] is None
    assert "Traceback" not in w.log_text()


def test_sync_tool_sees_cancellation(mp: Stack, daphne_a: Proc, procs: list[Proc]) -> None:
    w = mp.worker(concurrency=4)
    procs.append(w)
    with new_client(daphne_a) as client:
        tid = client.call_task("demo_sync_sleep", {"ms": 20000})["taskId"]
        wait_for("the sync tool to run", lambda: sql(
            mp, "SELECT running FROM mcptasks_workerheartbeat WHERE worker_id = %s", (worker_id_of(w),)) == [(1,)])
        t0 = time.monotonic()
        client.request("tasks/cancel", {"taskId": tid})
        wait_for("the sync tool to stop", lambda: sql(
            mp, "SELECT running FROM mcptasks_workerheartbeat WHERE worker_id = %s", (worker_id_of(w),)) == [(0,)],
            timeout=5)
        # Stopped well before its 20 s (the heartbeat row itself refreshes every 0.5 s).
        assert time.monotonic() - t0 < 2 * HEARTBEAT_S + 1
        assert client.request("tasks/get", {"taskId": tid}).result["status"] == "cancelled"


# --- limits ---------------------------------------------------------------------------------------


def test_max_concurrency_holds_across_two_workers(mp: Stack, daphne_a: Proc, procs: list[Proc]) -> None:
    pool = [mp.worker(concurrency=4), mp.worker(concurrency=4)]
    procs += pool
    prefix = "serial-" + secrets.token_hex(3)
    with new_client(daphne_a) as client:
        ids = [client.call_task("test_serial", {"key": f"{prefix}-{i}", "ms": 200})["taskId"] for i in range(6)]
        # Both workers compete for every slot; the one that ran the first task then drains and
        # leaves, so the other certainly runs some too (a finishing worker tends to re-claim
        # first, which would let one worker run them all and prove nothing).
        assert wait_terminal(client, ids[0])["status"] == "completed"
        first = task_row(mp, ids[0])["worker_id"]
        leaving = next(w for w in pool if worker_id_of(w) == first)
        assert leaving.terminate(timeout=15) == 0
        for tid in ids:
            assert wait_terminal(client, tid)["status"] == "completed"
    rows = sql(mp, "SELECT task_key, event, at FROM mcptasks_testing_runrecord WHERE task_key LIKE %s "
                   "ORDER BY at, id", (prefix + "%",))
    assert len(rows) == 12
    running = 0
    for _key, event, _at in rows:
        running += 1 if event == "start" else -1
        assert running <= 1, rows  # max_concurrency=1 across both workers
    workers = {r[0] for r in sql(mp, "SELECT DISTINCT worker_id FROM mcptasks_task WHERE task_id = ANY(%s)", (ids,))}
    assert workers == {worker_id_of(w) for w in pool}


def test_timeout_fails_task_with_status_message(mp: Stack, daphne_a: Proc, procs: list[Proc]) -> None:
    procs.append(mp.worker(concurrency=2))
    with new_client(daphne_a) as client:
        tid = client.call_task("test_timeout", {"ms": 5000})["taskId"]
        done = wait_terminal(client, tid, timeout=10)
    assert done["status"] == "failed"
    assert done["statusMessage"] == "Tool test_timeout timed out after 0.5s"


# --- throughput -----------------------------------------------------------------------------------

#: Correctness at volume, not a benchmark (bench/bulk_tasks.sh runs 10,000 and reports rates).
BULK = int(os.environ.get("MCPTASKS_TEST_BULK_TASKS", "3000"))


@pytest.mark.timeout(900)
def test_bulk_tasks_over_four_workers_end_terminal_exactly_once(mp: Stack, procs: list[Proc]) -> None:
    before = {r[0] for r in sql(mp, "SELECT task_id FROM mcptasks_task")}
    # Every worker runs before the tasks arrive, so all four share them: started one after the
    # other into a full queue, the first ones took every task before the last one was up.
    workers = [mp.worker(concurrency=16) for _ in range(4)]
    procs += workers
    started = time.monotonic()
    out = mp.manage("mcptasks_enqueue", "test_tick", "--count", str(BULK), "--arguments", '{"n": 1}')
    assert f"enqueued {BULK} tasks" in out.stdout

    def remaining() -> int:
        return int(sql(mp, "SELECT count(*) FROM mcptasks_task WHERE tool_name = 'test_tick' "
                           "AND status IN ('working', 'input_required')")[0][0])

    wait_for(f"{BULK} tasks to end", lambda: remaining() == 0,
             timeout=float(os.environ.get("MCPTASKS_TEST_BULK_TIMEOUT_S", "900")), every=0.5)
    elapsed = time.monotonic() - started
    rows = sql(mp, "SELECT task_id, status, attempt, worker_id, result FROM mcptasks_task "
                   "WHERE tool_name = 'test_tick'")
    rows = [r for r in rows if r[0] not in before]
    assert len(rows) == BULK
    assert {r[1] for r in rows} == {"completed"}
    # Claimed exactly once each (every claim bumps the attempt), and the tool said so itself.
    assert {r[2] for r in rows} == {1}
    assert all(r[4]["content"][0]["text"] == "tick 1 attempt 1" for r in rows)
    per_worker: dict[str, int] = {}
    for r in rows:
        per_worker[r[3]] = per_worker.get(r[3], 0) + 1
    assert set(per_worker) == {worker_id_of(w) for w in workers}, per_worker
    print(f"\n{BULK} tasks over 4 workers in {elapsed:.1f}s ({BULK / elapsed:.0f}/s); per worker {per_worker}")
    for w in workers:
        assert w.terminate(timeout=20) == 0
    # Issue 14: the audit chains hold after the bulk run (appends take no lock; the sealer chains them).
    mp.manage("mcptasks_audit", "seal")
    verified = mp.manage("mcptasks_audit", "verify").stdout
    assert "BROKEN" not in verified and "OK" in verified, verified


def test_max_tasks_and_burst_workers_exit_when_their_work_is_done(tmp_path: Any) -> None:
    """Issue 14: ``--max-tasks N`` runs N tasks then exits; ``--burst`` exits once nothing is runnable."""
    require_multiprocess()
    from tests.support.servers import make_stack

    own, teardown = make_stack(tmp_path)  # a database of its own: no other test's tasks to claim
    try:
        own.manage("mcptasks_enqueue", "test_tick", "--count", "7", "--arguments", '{"n": 2}')

        def done() -> list[tuple[Any, ...]]:
            return sql(own, "SELECT status, attempt FROM mcptasks_task WHERE status = 'completed'")

        own.manage("mcptasks_worker", "--max-tasks", "3", "--concurrency", "2")
        assert len(done()) == 3
        own.manage("mcptasks_worker", "--burst", "--concurrency", "4")
        assert done() == [("completed", 1)] * 7
        assert sql(own, "SELECT count(*) FROM mcptasks_task WHERE status <> 'completed'")[0][0] == 0
        # What the runs appended was sealed before the workers exited, and it verifies.
        out = own.manage("mcptasks_audit", "verify").stdout
        assert "OK" in out and "unsealed" not in out
    finally:
        teardown()
