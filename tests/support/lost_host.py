"""A host lost mid-load: the scenario shared by tests/e2e/test_lost_host.py and bench/lost_host.py.

A "host" here is a process group on loopback: one web process (daphne or granian) and one
``mcptasks_worker``, all sharing the stack's PostgreSQL database and Redis. Losing the host is
SIGKILL of every one of its processes at once: no clean-up, no lease hand-back, no goodbye on
the channel layer. Unlike a machine that loses power, though, its kernel still closes its
connections. :mod:`tests.support.netns` runs the same scenario the hard way: hosts in network
namespaces behind PgBouncer and Sentinel, lost by freezing them and taking their link down.
Then nothing is closed or reset, and only the service's own bounds free what the host held.

The load is a mix of ``test_counted_retryable`` (rerun elsewhere after the lease lapses) and
``test_counted_once`` (failed with "worker lost during execution"), each recording its start
and end per attempt in ``RunRecord`` so the checks can see every run.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.support.client import McpClient
from tests.support.servers import Proc, Stack

TERMINAL = ("completed", "failed", "cancelled")
WORKER_LOST = "worker lost during execution"
HOST_ENV = {
    # A short lease so orphans are taken over quickly; the heartbeat renews well within it.
    "MCPTASKS_WORKER_LEASE_S": "4",
    "MCPTASKS_WORKER_HEARTBEAT_S": "0.5",
    "MCPTASKS_WORKER_POLL_S": "0.5",
}


@dataclass
class Host:
    """One web process and one worker: a machine of the deployment."""

    name: str
    web: Proc
    worker: Proc

    @property
    def worker_id(self) -> str:
        line = next(x for x in self.worker.log_text().splitlines() if "running (concurrency" in x)
        return line.split("worker ", 1)[1].split(" running", 1)[0]

    def lose(self) -> dict[str, Any]:
        """Lose the host (here: SIGKILL); returns what was observed of the loss, for the report.

        :class:`tests.support.netns.LostHost` freezes it and cuts its link instead.
        """
        self.kill()
        return {}

    def details(self) -> dict[str, Any]:
        """Observations made after the loss (none for a killed process group)."""
        return {}

    def kill(self) -> None:
        """SIGKILL every process of the host, as close to simultaneously as we can."""
        for p in (self.worker, self.web):
            if p.alive:
                p.popen.send_signal(9)
        for p in (self.worker, self.web):
            p.popen.wait(10)


@contextmanager
def hosts(stack: Stack, count: int = 3, *, concurrency: int = 4) -> Iterator[list[Host]]:
    """Start ``count`` hosts, alternating daphne and granian; every process is stopped after."""
    started: list[Host] = []
    try:
        for i in range(count):
            server = "granian" if i % 2 else "daphne"
            web = stack.web(server=server, embedded_worker=False, extra_env=HOST_ENV)
            worker = stack.worker(concurrency=concurrency, extra_env=HOST_ENV)
            started.append(Host(f"host{i}-{server}", web, worker))
        yield started
    finally:
        for h in started:
            for p in (h.web, h.worker):
                if p.alive:
                    p.terminate(timeout=10)


def sql(stack: Stack, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run a query on the stack's database from the test process."""
    import psycopg

    with psycopg.connect(stack.env["DATABASE_URL"], autocommit=True) as conn:
        cur = conn.execute(query, params)
        return list(cur.fetchall()) if cur.description else []


@dataclass
class Load:
    """What one client thread (bound to one host's web process) did and saw."""

    host: Host
    client: int = 0  # which of the host's clients
    tasks: list[tuple[str, str, str]] = field(default_factory=list)  # (task id, tool, key)
    errors: list[str] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)


def drive(load: Load, *, count: int, gap_s: float, ms: tuple[int, int], stop: threading.Event,
          run_id: str) -> None:
    """Create ``count`` tasks through ``load.host``'s web process, one every ``gap_s``.

    Stops at the first error when the host is being killed (``stop`` set): its clients lose
    their server, which is expected; any error before that is recorded as a failure.
    """
    tag = f"{load.host.name}c{load.client}"
    rng = random.Random(run_id + tag)
    try:
        client = McpClient(load.host.web.url)
        client.initialize()
    except Exception as exc:  # noqa: BLE001 - every failure is a finding, reported by the caller
        load.errors.append(f"initialize: {exc!r}")
        return
    with client:
        for i in range(count):
            if stop.is_set():
                return
            tool = "test_counted_once" if i % 3 == 2 else "test_counted_retryable"
            key = f"{run_id}-{tag}-{i}"
            try:
                task = client.call_task(tool, {"key": key, "ms": rng.randint(*ms)})
                load.tasks.append((task["taskId"], tool, key))
            except Exception as exc:  # noqa: BLE001
                if stop.is_set():
                    return
                load.errors.append(f"create {key}: {exc!r}")
            time.sleep(gap_s)


def follow(load: Load, *, timeout: float) -> None:
    """Poll every task of ``load`` with tasks/get through its host until each is terminal."""
    deadline = time.monotonic() + timeout
    with McpClient(load.host.web.url) as client:
        client.initialize()
        pending = {tid for tid, _tool, _key in load.tasks}
        while pending and time.monotonic() < deadline:
            for tid in sorted(pending):
                try:
                    status = client.request("tasks/get", {"taskId": tid}).result["status"]
                except Exception as exc:  # noqa: BLE001
                    load.errors.append(f"tasks/get {tid}: {exc!r}")
                    pending.discard(tid)
                    continue
                if status in TERMINAL:
                    load.statuses[tid] = status
                    pending.discard(tid)
            time.sleep(0.3)
        for tid in pending:
            load.errors.append(f"task {tid} not terminal after {timeout:.0f} s")


@dataclass
class Outcome:
    """The figures of one run."""

    created: int
    orphaned: int
    orphan_ids: list[str]
    takeover_s: float
    survivor_errors: list[str]
    lost_host_errors: int
    problems: list[str]
    kill_wall: float
    lost_detail: dict[str, Any] = field(default_factory=dict)


def run(stack: Stack, hs: list[Host], *, per_host: int, gap_s: float, ms: tuple[int, int],
        settle_s: float, min_running: int = 2, clients_per_host: int = 1) -> Outcome:
    """Drive the load through every host, lose the last host mid-load, check the end state.

    ``per_host`` tasks per client, ``clients_per_host`` clients on each host's web process.
    """
    run_id = "lh" + secrets.token_hex(3)
    victim = hs[-1]
    victim_worker = victim.worker_id
    stop = threading.Event()
    loads = [Load(h, c) for h in hs for c in range(clients_per_host)]
    # Daemon threads: a client of a host cut off the network may hang in a request until its
    # timeout, and must not hold the run (or the interpreter) hostage.
    threads = [
        threading.Thread(target=drive, args=(ld,), daemon=True,
                         kwargs={"count": per_host, "gap_s": gap_s, "ms": ms, "stop": stop if ld.host is victim
                                 else threading.Event(), "run_id": run_id})
        for ld in loads
    ]
    for t in threads:
        t.start()
    # Mid-load: wait until the victim's worker is running several tasks of this run.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        running = sql(stack, "SELECT count(*) FROM mcptasks_task WHERE status = 'working' AND worker_id = %s",
                      (victim_worker,))[0][0]
        if running >= min_running and len(loads[0].tasks) >= per_host // 3:
            break
        time.sleep(0.1)
    # The victim's clients go on until the loss (its web process should be busy when it
    # goes); what they see afterwards is counted apart.
    kill_wall = time.time()
    lost_detail = victim.lose()
    kill_wall = lost_detail.pop("wall", kill_wall)
    stop.set()
    # What the victim holds once it is gone are the orphans: read right after the loss (long
    # before any lease lapses), when the lost host can claim nothing more. A run it was
    # finishing in a transaction the loss cut short stays ``working``: an orphan too.
    orphan_ids = [r[0] for r in sql(
        stack, "SELECT task_id FROM mcptasks_task WHERE status = 'working' AND worker_id = %s", (victim_worker,))]
    survivors = [ld for ld in loads if ld.host is not victim]
    for t, ld in zip(threads, loads, strict=True):
        # The lost host's clients: an in-flight request may hang until its timeout.
        t.join(120 if ld.host is not victim else 2)
    followers = [threading.Thread(target=follow, args=(ld,), kwargs={"timeout": settle_s}) for ld in survivors]
    for t in followers:
        t.start()
    for t in followers:
        t.join(settle_s + 30)
    # The lost host's clients created tasks too (nobody polls them now): wait, within the
    # same bound, until no task of the run is left unfinished; one still unfinished after it
    # is reported as stranded by the check.
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and sql(
            stack, "SELECT count(*) FROM mcptasks_task WHERE params->'arguments'->>'key' LIKE %s "
            "AND status NOT IN ('completed', 'failed', 'cancelled')", (run_id + "-%",))[0][0]:
        time.sleep(0.3)
    problems = check(stack, run_id, orphan_ids, victim_worker)
    takeover = takeover_s(stack, orphan_ids, kill_wall)
    created = sql(stack, "SELECT count(*) FROM mcptasks_task WHERE params->'arguments'->>'key' LIKE %s",
                  (run_id + "-%",))[0][0]
    return Outcome(
        created=int(created), orphaned=len(orphan_ids), orphan_ids=orphan_ids, takeover_s=takeover,
        survivor_errors=[e for ld in survivors for e in ld.errors],
        lost_host_errors=sum(len(ld.errors) for ld in loads if ld.host is victim),
        problems=problems, kill_wall=kill_wall, lost_detail={**lost_detail, **victim.details()},
    )


def check(stack: Stack, run_id: str, orphan_ids: list[str], victim_worker: str) -> list[str]:
    """Every task of the run: exactly one terminal state, one terminal audit event, one completed run."""
    problems: list[str] = []
    rows = sql(stack, "SELECT task_id, status, status_message, attempt, worker_id, lease_expires_at, "
               "params->'arguments'->>'key' FROM mcptasks_task WHERE params->'arguments'->>'key' LIKE %s",
               (run_id + "-%",))
    if not rows:
        return [f"no task of run {run_id} found"]
    terminal_events = dict(sql(
        stack, "SELECT task_id, count(*) FROM mcptasks_auditevent WHERE action IN "
        "('task.completed', 'task.failed', 'task.cancelled') AND task_id = ANY(%s) GROUP BY task_id",
        ([r[0] for r in rows],)))
    ends = dict(sql(stack, "SELECT task_key, count(*) FROM mcptasks_testing_runrecord WHERE event = 'end' "
                    "AND task_key LIKE %s GROUP BY task_key", (run_id + "-%",)))
    for task_id, status, message, attempt, worker_id, _lease, key in rows:
        if status not in TERMINAL:
            problems.append(f"{task_id} ({key}) stranded {status} on worker {worker_id}")
            continue
        if terminal_events.get(task_id, 0) != 1:
            problems.append(f"{task_id} ({key}) has {terminal_events.get(task_id, 0)} terminal audit events")
        # A retryable run may have finished on the lost host with its outcome not yet written
        # (outcomes are written in batches) and rerun: tools run at least once, terminal states once.
        if status == "completed" and ends.get(key, 0) < 1:
            problems.append(f"{task_id} ({key}) completed without a finished run")
        if status == "failed" and message != WORKER_LOST:
            problems.append(f"{task_id} ({key}) failed: {message!r}")
        if status == "cancelled":
            problems.append(f"{task_id} ({key}) cancelled (nobody cancels in this run)")
    by_id = {r[0]: r for r in rows}
    for tid in orphan_ids:
        r = by_id.get(tid)
        if r is None:
            problems.append(f"orphan {tid} not found")
            continue
        _tid, status, message, attempt, worker_id, _lease, key = r
        if status == "completed" and attempt == 1:
            continue  # it finished on the lost host between the snapshot and the kill: no orphan
        if "once" in str(sql(stack, "SELECT tool_name FROM mcptasks_task WHERE task_id = %s", (tid,))[0][0]):
            if (status, message) != ("failed", WORKER_LOST):
                problems.append(f"orphan {tid} ({key}, non-retryable) ended {status} {message!r}")
        elif status != "completed" or attempt < 2 or worker_id == victim_worker:
            problems.append(f"orphan {tid} ({key}, retryable) ended {status} attempt {attempt} on {worker_id}")
    return problems


def takeover_s(stack: Stack, orphan_ids: list[str], kill_wall: float) -> float:
    """Seconds from the kill until the last orphan was taken over (rerun started or failed as lost)."""
    if not orphan_ids:
        return 0.0
    rerun = sql(stack, "SELECT max(extract(epoch FROM r.at)) FROM mcptasks_testing_runrecord r JOIN mcptasks_task t "
                "ON r.task_key = t.params->'arguments'->>'key' WHERE t.task_id = ANY(%s) AND r.attempt >= 2 "
                "AND r.event = 'start'", (orphan_ids,))[0][0]
    lost = sql(stack, "SELECT max(extract(epoch FROM created_at)) FROM mcptasks_auditevent "
               "WHERE action = 'task.failed' AND task_id = ANY(%s)", (orphan_ids,))[0][0]
    last = max(float(x) for x in (rerun, lost) if x is not None) if (rerun or lost) else float("nan")
    return last - kill_wall
