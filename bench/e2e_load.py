"""Issue 27 benchmark: the whole path of a task under concurrent load, next to the SDK peer.

The load: ``--procs`` client processes sharing ``--callers`` concurrent callers (closed loop). Each
caller creates a task of ``demo_sleep(ms=50)`` (``tools/call`` + ``task``), polls ``tasks/get``
every 100 ms until the task is terminal, then reads ``tasks/result``, and starts again. It runs
against the service (2 web processes, uvicorn by default, + 2 workers of ``--concurrency`` slots, PostgreSQL +
Redis, the tenant without limits or rates) and against the official SDK peer
(``bench/peers/sdk_server.py``, one uvicorn process, on the same uvloop and httptools the service's
uvicorn uses: both are installed with the project), in interleaved rounds of ``--seconds``. The
peer is started anew for each round (``--no-peer-per-round``: one peer for the whole run): the
SDK's in-memory store keeps every task for its ttl and slows as they pile up (79/s in a second
round against 179/s in the first), so a fresh peer is the comparison least kind to the service.

Per round and target it prints:

- throughput: tasks whose ``tasks/result`` was answered inside the round, per second;
- creation: the ``tools/call`` answer time (p50/p99);
- created -> terminal: ``lastUpdatedAt - createdAt`` of the terminal ``tasks/get`` (task timestamps);
- seen: the terminal timestamp to the first ``tasks/get`` that reports it, answered; and by that
  request's sending, with the share of tasks whose first ``tasks/get`` sent after the terminal
  timestamp saw it (the rest were read before the outcome's commit, which follows its timestamp);
- end to end: call sent -> ``tasks/result`` answered (p50/p99);
- CPU per task: user + system time read from ``/proc`` of the service's processes (web processes,
  workers and the PostgreSQL backends of the bench's database; Redis is shared with other users of
  the machine and not counted) or of the peer's process, divided by the tasks completed;
- the load generator's own CPU per task (its client processes) and requests per task (creation,
  polls, result). ``--client`` picks its HTTP client (``bench/loadclient.py``): aiohttp by
  default, httpx (the client of the earlier sessions' figures) for about 3x its CPU.

The summary gives each ratio of throughputs twice: of the means over all rounds, and per round
(the two targets of a round run back to back) with the median of those, which drifts less with
this machine's speed. It adds a CPU-bound model. The service's processes share every core with the load
generator: it completes at most cores / (service + load generator CPU per task) tasks a second.
The peer is one process, so one core at most: 1 / (peer CPU per task), or the machine's bound
if that is lower. The model prints both bounds, their ratio, and the service CPU per task at
which the ratio would reach 1.5x with the same load generator.

After the rounds it checks that every task of the service completed exactly once (one attempt,
the tool's own output). Usage (PostgreSQL + Redis as in CI)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/e2e_load.py [--rounds 2] [--seconds 20] [--procs 4] [--callers 60] \\
        [--concurrency 8] [--only service|peer] [--base PATH] [--autovacuum S]

``--base PATH`` also starts the code of another checkout (e.g. ``git worktree add`` of ``main``)
and measures it as ``base`` in every round, next to this checkout (``service``) and the peer.

The machine's load (``/proc/loadavg``) is printed with every round: compare figures only within one run.

The header says whether the PostgreSQL server runs autovacuum. CI's (and this machine's) does
not: its task table is never analyzed nor vacuumed, so the prepared claim keeps the plan made on
the empty table (sequential scans of a table that grows through the run). ``--autovacuum S``
stands in for it (:class:`AutovacuumStandIn`), for both trees alike.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from bench.loadclient import CLIENTS, LoadClient, make_client, open_session  # noqa: E402
from tests.support.servers import (  # noqa: E402
    FAST_SETTINGS,
    PRODUCTION_SERVER,
    WEB_SERVERS,
    descendants,
    free_port,
    make_stack,
)

TERMINAL = {"completed", "failed", "cancelled"}
TICK = os.sysconf("SC_CLK_TCK")


# --- the load generator (runs in each client process) -------------------------------------------


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def _caller(client: LoadClient, url: str, headers: dict[str, str], stop_at: float,
                  out: list[tuple[float, ...]], failures: list[str]) -> None:
    """Closed loop until ``stop_at`` (monotonic): per task (done_at, create_ms, c2t_ms, seen_ms,
    e2e_ms, sent_ms, first, requests): ``sent_ms`` is the terminal timestamp to the sending of the
    ``tasks/get`` that saw it, ``first`` 1 when no earlier ``tasks/get`` had been sent after that
    timestamp (the first poll after the change saw it), else 0; ``requests`` the task's requests
    (creation, polls, result)."""
    rid = 0
    while time.monotonic() < stop_at:
        try:
            rid += 1
            t0 = time.monotonic()
            created = await client.post(url, headers, {
                "jsonrpc": "2.0", "id": rid, "method": "tools/call",
                "params": {"name": "demo_sleep", "arguments": {"ms": 50}, "task": {"ttl": 600_000}}})
            t_created = time.monotonic()
            task_id = created["result"]["task"]["taskId"]
            sent_wall = prev_sent_wall = 0.0
            polls = 0
            while True:
                polls += 1
                await asyncio.sleep(0.1)
                rid += 1
                prev_sent_wall, sent_wall = sent_wall, time.time()
                got = await client.post(url, headers, {"jsonrpc": "2.0", "id": rid, "method": "tasks/get",
                                                         "params": {"taskId": task_id}})
                seen_wall = time.time()
                task = got["result"]
                if task["status"] in TERMINAL:
                    break
            rid += 1
            done = await client.post(url, headers, {"jsonrpc": "2.0", "id": rid, "method": "tasks/result",
                                                      "params": {"taskId": task_id}})
            t_done = time.monotonic()
            if "error" in done or task["status"] != "completed":
                raise RuntimeError(f"task {task['status']}: {done.get('error')}")
            terminal_at = _ts(task["lastUpdatedAt"])
            out.append((t_done, (t_created - t0) * 1000, (terminal_at - _ts(task["createdAt"])) * 1000,
                        (seen_wall - terminal_at) * 1000, (t_done - t0) * 1000, (sent_wall - terminal_at) * 1000,
                        1.0 if prev_sent_wall < terminal_at else 0.0, float(polls + 2)))
        except Exception as exc:  # counted and reported: a server may fail under load
            failures.append(f"{type(exc).__name__}: {str(exc)[:160]}")
            await asyncio.sleep(0.1)


async def _client_main(urls: list[str], token: str, callers: int, start_at: float, seconds: float, kind: str
                       ) -> tuple[list[tuple[float, ...]], list[str]]:
    out: list[tuple[float, ...]] = []
    failures: list[str] = []
    client = make_client(kind, callers * 2)
    try:
        # One session per caller (a client of its own), the callers spread over the web processes.
        sessions = [(urls[i % len(urls)], await open_session(client, urls[i % len(urls)], token))
                    for i in range(callers)]
        await asyncio.sleep(max(0.0, start_at - time.time()))
        stop_at = time.monotonic() + seconds
        await asyncio.gather(*[_caller(client, *sessions[i], stop_at, out, failures) for i in range(callers)])
    finally:
        await client.aclose()
    # monotonic clocks are system-wide on Linux: the parent compares done_at with its own window.
    return out, failures


def _client_proc(args: tuple[list[str], str, int, float, float, str], queue: Any) -> None:
    queue.put(asyncio.run(_client_main(*args)))


# --- measuring ----------------------------------------------------------------------------------


def _cpu_ticks(pids: list[int]) -> dict[int, int]:
    ticks = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks[pid] = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks


def _run_queue_ns(pids: list[int]) -> dict[int, int]:
    """Nanoseconds each process's threads have spent runnable but waiting for a core
    (``/proc/PID/task/*/schedstat``, second field): next to the CPU a role used, what it waited
    for a core to use it. On two shared cores a tail latency is mostly that wait (issue 27,
    twenty-seventh session in ``bench/RESULTS.md``)."""
    waits = {}
    for pid in pids:
        total, seen = 0, False
        try:
            threads = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for thread in threads:
            try:
                total += int((thread / "schedstat").read_text().split()[1])
                seen = True
            except (OSError, IndexError, ValueError):
                continue  # the thread ended, or the kernel keeps no schedstats
        if seen:
            waits[pid] = total
    return waits


def _per_role_ms(roles: dict[str, list[int]], before: dict[int, int], after: dict[int, int], *, scale: float,
                 n: int) -> dict[str, float]:
    """Each role's growth between two readings (``scale`` units a second) in ms per one of ``n``."""
    return {role: sum(after.get(pid, 0) - before.get(pid, 0) for pid in group if pid in after) / scale * 1000 / n
            if n else 0.0 for role, group in roles.items()}


def _pg_backends(dsn: str) -> list[int]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()").fetchall()
    return [int(r[0]) for r in rows]


def server_autovacuum(dsn: str) -> str:
    """The server's ``autovacuum`` setting (``on``/``off``)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    return str(row[0]) if row else "?"


class AutovacuumStandIn:
    """``--autovacuum S``: every ``S`` seconds, vacuum and analyze each table of the given
    databases that PostgreSQL's autovacuum would pick with its default rule (more than 50 +
    20 % dead rows, or 50 + 10 % rows changed since the last analyze), for a server that runs
    with ``autovacuum = off`` (as CI's does). Without it, a young task table is never analyzed:
    a prepared statement keeps the plan made on the empty table. Each database gets one
    connection for the bench's whole run, so its CPU counts in the ``postgres`` role."""

    RULE = ("SELECT relname FROM pg_stat_user_tables WHERE n_dead_tup > 50 + 0.2 * n_live_tup "
            "OR n_mod_since_analyze > 50 + 0.1 * n_live_tup")

    def __init__(self, dsns: list[str], every: float) -> None:
        import threading

        self.dsns, self.every, self.passes, self.tables = dsns, every, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psycopg
        from psycopg import sql

        conns = [psycopg.connect(dsn, autocommit=True) for dsn in self.dsns]
        try:
            while not self._stop.wait(self.every):
                for conn in conns:
                    for (table,) in conn.execute(self.RULE).fetchall():
                        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table)))
                        self.tables += 1
                self.passes += 1
        finally:
            for conn in conns:
                conn.close()

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(60)
        return f"autovacuum stand-in: {self.passes} passes, {self.tables} table vacuums"


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


def run_round(name: str, urls: list[str], token: str, args: argparse.Namespace, pids: Any) -> dict[str, Any]:
    """One round of the load against ``urls``; ``pids()`` maps each role (web, worker, postgres,
    peer) to the processes whose CPU is counted."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    per = [args.callers // args.procs + (1 if i < args.callers % args.procs else 0) for i in range(args.procs)]
    start_at = time.time() + 8.0  # every client process has its sessions before the clock starts
    procs = [ctx.Process(target=_client_proc, args=((urls, token, n, start_at, args.seconds, args.client), queue))
             for n in per]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    roles_before = pids()
    pids_before = [pid for group in roles_before.values() for pid in group]
    before, waited_before = _cpu_ticks(pids_before), _run_queue_ns(pids_before)
    # The load generator's own CPU, apart: it shares the cores with the target.
    clients_before = _cpu_ticks([p.pid for p in procs if p.pid is not None])
    window_start = time.monotonic()
    window_end = window_start + args.seconds
    time.sleep(args.seconds)
    roles = pids()
    for role, group in roles_before.items():
        roles[role] = list(set(roles.get(role, [])) | set(group))
    pids_after = [pid for group in roles.values() for pid in group]
    after, waited_after = _cpu_ticks(pids_after), _run_queue_ns(pids_after)
    clients_after = _cpu_ticks(list(clients_before))
    load = Path("/proc/loadavg").read_text().split()[:3]
    results = [queue.get(timeout=args.seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    rows = [r for out, _ in results for r in out if window_start <= r[0] <= window_end]
    failures = [f for _, fs in results for f in fs]
    cpu_s = sum(after[pid] - before.get(pid, 0) for pid in after) / TICK
    n = len(rows)
    by_role = _per_role_ms(roles, before, after, scale=TICK, n=n)
    waited_by_role = _per_role_ms(roles, waited_before, waited_after, scale=1e9, n=n)
    stats = {
        "name": name, "tasks": n, "per_s": n / args.seconds, "failures": failures,
        "create": [r[1] for r in rows], "c2t": [r[2] for r in rows], "seen": [r[3] for r in rows],
        "e2e": [r[4] for r in rows], "sent": [r[5] for r in rows], "first": [r[6] for r in rows],
        "cpu_ms_per_task": cpu_s * 1000 / n if n else float("nan"), "load": load,
        "cpu_by_role": by_role, "waited_by_role": waited_by_role, "requests": [r[7] for r in rows],
        "client_cpu_ms_per_task": (sum(clients_after[pid] - clients_before[pid] for pid in clients_after)
                                   / TICK * 1000 / n if n else float("nan")),
    }
    _print(stats)
    return stats


def _print(s: dict[str, Any]) -> None:
    def pp(key: str) -> str:
        return f"p50 {statistics.median(s[key]):.0f} / p99 {_pct(s[key], 0.99):.0f} ms" if s[key] else "n/a"

    print(f"  {s['name']:<9} {s['tasks']:5d} tasks = {s['per_s']:6.1f}/s | create {pp('create')} | "
          f"created->terminal {pp('c2t')} | terminal->seen {pp('seen')} | end-to-end {pp('e2e')} | "
          f"CPU {s['cpu_ms_per_task']:.1f} ms/task | load {' '.join(s['load'])}", flush=True)
    if s.get("first"):
        print(f"    terminal->seen by the poll's sending: {pp('sent')}; seen by the first poll sent after the "
              f"terminal timestamp: {100 * sum(s['first']) / len(s['first']):.1f} % of tasks", flush=True)
    if len(s.get("cpu_by_role", {})) > 1:
        print("    CPU ms/task by role: " + ", ".join(f"{role} {ms:.1f}" for role, ms in s["cpu_by_role"].items()),
              flush=True)
    if len(s.get("waited_by_role", {})) > 1:
        print("    waiting for a core, ms/task by role: "
              + ", ".join(f"{role} {ms:.1f}" for role, ms in s["waited_by_role"].items()), flush=True)
    if s.get("requests"):
        print(f"    load generator: {s['client_cpu_ms_per_task']:.1f} ms CPU/task for "
              f"{statistics.mean(s['requests']):.2f} requests/task", flush=True)
    if s["failures"]:
        print(f"    {len(s['failures'])} failures, e.g. {s['failures'][0]}", flush=True)


def _summary(all_stats: list[dict[str, Any]]) -> None:
    by: dict[str, list[dict[str, Any]]] = {}
    for s in all_stats:
        by.setdefault(s["name"], []).append(s)
    print("summary (all rounds):")
    merged = {}
    for name, runs in by.items():
        merged[name] = m = {"name": name, "tasks": sum(r["tasks"] for r in runs),
                            "per_s": statistics.mean(r["per_s"] for r in runs),
                            "failures": [f for r in runs for f in r["failures"]],
                            "cpu_ms_per_task": statistics.mean(r["cpu_ms_per_task"] for r in runs),
                            "load": runs[-1]["load"],
                            "client_cpu_ms_per_task": statistics.mean(r["client_cpu_ms_per_task"] for r in runs),
                            "cpu_by_role": {role: statistics.mean(r["cpu_by_role"].get(role, 0.0) for r in runs)
                                            for role in runs[0]["cpu_by_role"]},
                            "waited_by_role": {role: statistics.mean(r["waited_by_role"].get(role, 0.0) for r in runs)
                                               for role in runs[0]["waited_by_role"]}}
        for key in ("create", "c2t", "seen", "e2e", "sent", "first", "requests"):
            m[key] = [v for r in runs for v in r[key]]
        _print(m)
    for a, b in (("service", "peer"), ("base", "peer"), ("service", "base")):
        if a in merged and b in merged and merged[b]["per_s"]:
            # This machine's speed drifts by a fifth within minutes: the ratio of each round's
            # neighbours (measured back to back) is steadier than the ratio of the means.
            paired = [x["per_s"] / y["per_s"] for x, y in zip(by[a], by[b], strict=True) if y["per_s"]]
            print(f"  throughput {a}/{b}: {merged[a]['per_s'] / merged[b]['per_s']:.2f}x; per round "
                  + ", ".join(f"{r:.2f}" for r in paired) + f" (median {statistics.median(paired):.2f}x)")
    if "service" in merged and "peer" in merged:
        # With every core busy, the service completes about cores / (its CPU + the load
        # generator's per task); the peer, one process, at most one core's worth.
        sv, pe = merged["service"], merged["peer"]
        cores = os.cpu_count() or 1
        own, gen = sv["cpu_ms_per_task"], sv["client_cpu_ms_per_task"]
        service_bound = cores * 1000 / (own + gen)
        # One process: one core at most, or the machine's share if the load generator leaves less.
        peer_bound = min(1000 / pe["cpu_ms_per_task"],
                         cores * 1000 / (pe["cpu_ms_per_task"] + pe["client_cpu_ms_per_task"]))
        needed = cores * 1000 / (1.5 * peer_bound) - gen
        print(f"  CPU-bound model: service <= {cores} x 1000 / ({own:.1f} + {gen:.1f}) = {service_bound:.0f}/s, "
              f"peer <= {peer_bound:.0f}/s: {service_bound / peer_bound:.2f}x; 1.5x needs the service at "
              f"<= {needed:.1f} ms CPU per task")


def exactly_once(dsn: str) -> str:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT status, attempt, result->'content'->0->>'text' FROM mcptasks_task").fetchall()
    bad = [r for r in rows if r[0] not in TERMINAL or r[1] != 1 or (r[0] == "completed" and "50" not in (r[2] or ""))]
    live = sum(1 for r in rows if r[0] not in TERMINAL)
    return f"{len(rows)} tasks, {len(rows) - len(bad)} completed once, {live} still live, {len(bad)} other"


def phases(dsn: str) -> str:
    """Where created -> terminal goes: waiting to be claimed, then claimed -> finished (the run
    and the outcome write), p50 / p99 over every terminal task of the run."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT EXTRACT(EPOCH FROM started_at - created_at) * 1000, "
            "EXTRACT(EPOCH FROM finished_at - started_at) * 1000 FROM mcptasks_task "
            "WHERE started_at IS NOT NULL AND finished_at IS NOT NULL").fetchall()
    if not rows:
        return "no finished tasks"
    wait, run = [float(r[0]) for r in rows], [float(r[1]) for r in rows]
    return (f"created -> claimed p50 {statistics.median(wait):.0f} / p99 {_pct(wait, 0.99):.0f} ms, "
            f"claimed -> finished p50 {statistics.median(run):.0f} / p99 {_pct(run, 0.99):.0f} ms")


def _start_service(repo: Path, concurrency: int, server: str, env: dict[str, str] | None = None
                   ) -> tuple[Any, str, list[str], dict[str, list[int]]]:
    """A stack of ``repo``'s code: 2 web processes under ``server`` + 2 workers, the bench tenant
    without limits or rates; ``env`` is added to every process's environment."""
    from tests.support import servers

    servers.REPO = repo  # the processes (and manage.py) run in that checkout
    work = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    stack, teardown = make_stack(work)
    stack.teardown = teardown  # type: ignore[attr-defined]  # kept with the stack for the end of the run
    for key in ("MCPTASKS_ALLOW_ANONYMOUS", *FAST_SETTINGS):
        stack.env.pop(key, None)
    stack.env["DEBUG"] = "0"
    stack.env["MCPTASKS_AUDIT_KEY"] = "bench-audit-key"
    stack.env.update(env or {})
    token = stack.token("bench", "bencher")
    stack.manage("shell", "-c", "from tenants.models import Tenant; Tenant.objects.filter(slug='bench').update("
                 "max_concurrent_tasks=None, max_concurrent_tasks_per_principal=None, rate_create_per_min=None, "
                 "rate_read_per_min=None, rate_other_per_min=None)")
    webs = [stack.web(server=server, embedded_worker=False) for _ in range(2)]
    workers = [stack.worker(concurrency=concurrency) for _ in range(2)]
    # granian runs the application in a child process: its CPU counts too.
    return stack, token, [w.url for w in webs], {"web": descendants([p.popen.pid for p in webs]),
                                                 "worker": [p.popen.pid for p in workers]}


def start_peer() -> tuple[subprocess.Popen[bytes], str]:
    """Start the SDK peer (``bench/peers/sdk_server.py``) and wait until it answers: (process, URL)."""
    port = free_port()
    peer = subprocess.Popen([sys.executable, str(REPO / "bench/peers/sdk_server.py"), str(port)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/mcp"
    for _ in range(150):
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    return peer, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--callers", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--only", choices=("service", "peer"))
    parser.add_argument("--client", choices=CLIENTS, default="aiohttp",
                        help="the load generator's HTTP client (bench/loadclient.py; httpx costs about 3x the CPU)")
    parser.add_argument("--peer-per-round", action=argparse.BooleanOptionalAction, default=True,
                        help="start a new SDK peer for each round (default): its in-memory store, which slows as "
                             "tasks pile up, starts empty in every round; --no-peer-per-round keeps one peer")
    parser.add_argument("--server", choices=tuple(WEB_SERVERS), default=PRODUCTION_SERVER,
                        help=f"the service's web server (default {PRODUCTION_SERVER}, the documented production "
                             "server)")
    parser.add_argument("--base", type=Path, help="another checkout (e.g. a worktree of main): measured as 'base' "
                                                  "in the same rounds, for before/after figures in one run")
    parser.add_argument("--base-server", choices=tuple(WEB_SERVERS), help="base's web server (default: --server's)")
    parser.add_argument("--base-env", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment variable for base's processes only (repeatable): with --base . it "
                             "compares one setting on the same tree")
    parser.add_argument("--autovacuum", type=float, default=0.0, metavar="S",
                        help="every S seconds, vacuum and analyze the stacks' tables by autovacuum's default rule "
                             "(for a server with autovacuum off, as CI's; see AutovacuumStandIn)")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        sys.exit("set DATABASE_URL (PostgreSQL) and REDIS_URL")

    stacks: dict[str, tuple[Any, str, list[str], dict[str, list[int]]]] = {}
    peer = None
    standin: AutovacuumStandIn | None = None
    try:
        if args.only != "peer":
            if args.base is not None:
                stacks["base"] = _start_service(args.base.resolve(), args.concurrency, args.base_server or args.server,
                                                dict(item.split("=", 1) for item in args.base_env))
            stacks["service"] = _start_service(REPO, args.concurrency, args.server)
        peer, peer_url = start_peer()
        dsns = [stack.env["DATABASE_URL"] for stack, _t, _u, _p in stacks.values()]
        maintenance = ""
        if dsns:
            maintenance = f"; PostgreSQL autovacuum {server_autovacuum(dsns[0])}"
            if args.autovacuum > 0:
                standin = AutovacuumStandIn(dsns, args.autovacuum)
                maintenance += f", stand-in every {args.autovacuum:g} s"
        print(f"e2e load: {args.procs} client processes, {args.callers} callers, demo_sleep 50 ms, tasks/get every "
              f"100 ms; service: 2 {args.server} + 2 workers x {args.concurrency}; peer: mcp SDK, 1 uvicorn; "
              f"{args.rounds} x {args.seconds:.0f} s rounds; {os.cpu_count()} CPUs; client {args.client}"
              + (f"; base: {args.base}" if args.base else "") + maintenance, flush=True)
        stats = []
        for i in range(args.rounds):
            print(f"round {i + 1}:", flush=True)
            # Alternate the order: the target measured right after another pays for the work
            # the other left behind (its vacuums, its sealer catching up).
            for name, (stack, token, urls, pids) in (list(stacks.items())[::-1] if i % 2 else stacks.items()):
                dsn = stack.env["DATABASE_URL"]
                stats.append(run_round(name, urls, token, args,
                                       lambda pids=pids, dsn=dsn: {**pids, "postgres": _pg_backends(dsn)}))
            if args.only != "service":
                if args.peer_per_round and i > 0:
                    # A new peer each round: its in-memory store starts empty, as in round 1
                    # (the SDK's slows as the tasks it keeps for their ttl pile up).
                    peer.kill()
                    peer.wait(10)
                    peer, peer_url = start_peer()
                stats.append(run_round("peer", [peer_url], "", args, lambda current=peer: {"peer": [current.pid]}))
        _summary(stats)
        if standin is not None:
            print(standin.stop())
        time.sleep(2)
        for name, (stack, _t, _u, _p) in stacks.items():
            print(f"{name} exactly once: {exactly_once(stack.env['DATABASE_URL'])}")
            print(f"{name} phases: {phases(stack.env['DATABASE_URL'])}")
    finally:
        if standin is not None:
            standin.stop()
        if peer is not None:
            peer.kill()
            peer.wait(10)
        for stack, _t, _u, _p in stacks.values():
            stack.teardown()


if __name__ == "__main__":
    main()
