"""Soak: a mixed load over 2 daphne processes and 2 workers on PostgreSQL + Redis.

Usage (PostgreSQL and Redis as in CI; default 600 s)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/soak.py [seconds] [--warmup S] [--sample S] [--tracemalloc]

Memory: the resident memory of every process is sampled every ``--sample`` seconds (default 60)
and printed as a curve; the growth after ``--warmup`` seconds (default 600, or a third of a
shorter run) is what the memory target is about. ``--tracemalloc`` starts the web processes with
tracing on (``bench/memtrace``), takes a heap snapshot of each at the end of the warm-up and at
the end, and prints the allocation sites that grew most in between.

Client threads, spread over both web processes, run in a loop: create a task and wait for its
result through ``tasks/result``; create and poll with ``tasks/get``; create and cancel; answer an
elicitation; follow a task's progress on a stream that is dropped after the first event and
resumed with ``Last-Event-ID`` (on the other process). Prints the resident memory of each
process at start and end, error counts and latency percentiles per operation.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.client import McpClient, SseEvent
from tests.support.servers import Proc, make_stack

TERMINAL = {"completed", "failed", "cancelled"}


class Stats:
    """Latencies and errors per operation, shared by the client threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.examples: dict[str, list[str]] = defaultdict(list)

    def time(self, op: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:
            self.error(op, repr(exc))
            return None
        with self.lock:
            self.latency[op].append(time.perf_counter() - t0)
        return value

    def error(self, op: str, what: str) -> None:
        with self.lock:
            self.errors[op] += 1
            if len(self.examples[op]) < 5:  # the first few, with when they happened
                self.examples[op].append(what[:300])


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


_STARTED = time.monotonic()


def _minute() -> str:
    """When an error happened (minutes into the run), for the error examples."""
    return f"minute {(time.monotonic() - _STARTED) / 60:.1f}"


def scenario(name: str, web: list[Proc], stats: Stats, stop: float, worker_no: int) -> None:
    """One client thread: ``name`` in a loop until ``stop``."""
    home, other = web[worker_no % 2], web[(worker_no + 1) % 2]
    client = McpClient(home.url, timeout=60)
    client.initialize()
    while time.monotonic() < stop:
        if name == "result":
            task = stats.time("create", lambda: client.call_task("demo_sleep", {"ms": 200}))
            if task:
                reply = stats.time("result", lambda t=task: client.request("tasks/result", {"taskId": t["taskId"]}))
                # A stream that ends without the result (at its lifetime) is an error too: it
                # used to count as a success with a latency of ~300 s.
                if reply is not None and (not reply.message or "result" not in reply.message):
                    stats.error("result", f"at {_minute()}: {reply.message}")
        elif name == "poll":
            task = stats.time("create", lambda: client.call_task("demo_sleep", {"ms": 300}))
            status = "working"
            while task and status not in TERMINAL and time.monotonic() < stop + 30:
                got = stats.time("get", lambda t=task: client.request("tasks/get", {"taskId": t["taskId"]}))
                status = got.result["status"] if got is not None and got.message and "result" in got.message else "?"
                if status == "?":
                    break
                time.sleep(0.1)
        elif name == "cancel":
            task = stats.time("create", lambda: client.call_task("demo_sleep", {"ms": 5000}))
            if task:
                time.sleep(0.2)
                reply = stats.time("cancel", lambda t=task: client.request("tasks/cancel", {"taskId": t["taskId"]}))
                if reply is not None and reply.result.get("status") != "cancelled":
                    stats.error("cancel", str(reply.message))
        elif name == "elicit":
            task = stats.time("create", lambda: client.call_task("demo_ask", {"question": "name?"}))
            if task:
                reply = stats.time("elicit", lambda t=task: client.request(
                    "tasks/result", {"taskId": t["taskId"]},
                    on_request=lambda r: {"action": "accept", "content": {"answer": "soak"}},
                ))
                if reply is not None and (not reply.message or "result" not in reply.message
                                          or reply.result["content"][0]["text"] != "soak"):
                    stats.error("elicit", f"at {_minute()}: {reply.message}")
        elif name == "resume":
            task = stats.time("create", lambda: client.call_task("demo_progress", {"steps": 4, "interval_ms": 100}))
            if not task:
                continue
            seen: list[SseEvent] = []

            def first_only(ev: SseEvent, seen: list[SseEvent] = seen) -> bool:
                seen.append(ev)
                return ev.message is not None

            tid = task["taskId"]
            client.request("tasks/result", {"taskId": tid}, on_event=first_only)
            last = next((e.id for e in reversed(seen) if e.id), None)
            if last is None:
                stats.error("resume", "no event id on the first stream")
                continue
            twin = McpClient(other.url, timeout=60)
            twin.session_id, twin.protocol_version = client.session_id, client.protocol_version
            reply = stats.time("resume", lambda tw=twin, ev=last: tw.resume(ev, method="tasks/result"))
            twin.close()
            if reply is not None and (not reply.message or "result" not in reply.message):
                stats.error("resume", f"at {_minute()}: {reply.message}")
    client.close()


def _option(name: str, default: float) -> float:
    if name in sys.argv:
        return float(sys.argv[sys.argv.index(name) + 1])
    return default


def _snapshot(proc: Proc, folder: Path, timeout: float = 120.0) -> Path | None:
    """Ask ``proc`` (started with bench/memtrace) for a tracemalloc snapshot; its path, or None."""
    before = set(folder.glob(f"{proc.popen.pid}-*.snap"))
    proc.popen.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = set(folder.glob(f"{proc.popen.pid}-*.snap")) - before
        if new:
            return new.pop()
        time.sleep(0.5)
    return None


def _growth(first: Path, last: Path, top: int = 15) -> list[str]:
    """The allocation sites that grew most between two snapshots (project and library frames)."""
    import tracemalloc

    noise = [tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
             tracemalloc.Filter(False, tracemalloc.__file__)]
    a = tracemalloc.Snapshot.load(str(first)).filter_traces(noise)
    b = tracemalloc.Snapshot.load(str(last)).filter_traces(noise)
    lines = [str(stat) for stat in b.compare_to(a, "lineno")[:top]]
    for stat in b.compare_to(a, "traceback")[:5]:  # where the largest ones come from
        lines.append(f"{stat.size_diff / 1024:.0f} KiB in {stat.count_diff} blocks from:")
        lines.extend("    " + line for line in stat.traceback.format(limit=8, most_recent_first=True))
    return lines


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1][0].isdigit() else 600.0
    warmup = _option("--warmup", min(600.0, seconds / 3))
    sample = _option("--sample", 60.0)
    traced = "--tracemalloc" in sys.argv
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        sys.exit("set DATABASE_URL (PostgreSQL) and REDIS_URL")
    stack, teardown = make_stack(Path(tempfile.mkdtemp(prefix="soak-")))
    try:
        # Production settings: with DEBUG on, Django keeps the last 9,000 queries of every
        # connection (nothing resets them on the MCP endpoint), which reads as a leak.
        # The production lease and heartbeat too: the test stack's 3 s lease lapsed once in an
        # hour at load average 26 (the task failed "worker lost during execution", correctly).
        settings = {"MCPTASKS_ALLOW_ANONYMOUS": "1", "MCPTASKS_DEMO_TOOLS": "1", "DEBUG": "0",
                    "MCPTASKS_WORKER_LEASE_S": "30", "MCPTASKS_WORKER_HEARTBEAT_S": "5"}
        snaps = Path(tempfile.mkdtemp(prefix="soak-snaps-"))
        web_env = dict(settings)
        if traced:
            web_env |= {"SOAK_SNAPSHOT_DIR": str(snaps),
                        "PYTHONPATH": str(Path(__file__).resolve().parent / "memtrace")}
        web = [stack.daphne(embedded_worker=False, extra_env=web_env) for _ in range(2)]
        workers = [stack.worker(concurrency=16, extra_env=settings) for _ in range(2)]
        procs = {f"web{i + 1}": p for i, p in enumerate(web)} | {f"worker{i + 1}": p for i, p in enumerate(workers)}
        McpClient(web[0].url).initialize()  # warm up
        start_rss = {k: rss_kb(p.popen.pid) for k, p in procs.items()}
        stats = Stats()
        stop = time.monotonic() + seconds
        mix = ["result"] * 4 + ["poll"] * 4 + ["cancel"] * 2 + ["elicit"] * 2 + ["resume"] * 2
        threads = [threading.Thread(target=scenario, args=(n, web, stats, stop, i), daemon=True)
                   for i, n in enumerate(mix)]
        t0 = time.monotonic()
        global _STARTED
        _STARTED = t0
        for t in threads:
            t.start()
        curve: list[tuple[float, dict[str, int]]] = [(0.0, start_rss)]
        first_snaps: dict[str, Path | None] = {}
        while any(t.is_alive() for t in threads) and time.monotonic() - t0 < seconds + 120:
            next_sample = t0 + len(curve) * sample
            time.sleep(max(0.0, min(next_sample, stop) - time.monotonic()) or 0.5)
            now = time.monotonic() - t0
            if traced and not first_snaps and now >= warmup:
                first_snaps = {f"web{i + 1}": _snapshot(p, snaps) for i, p in enumerate(web)}
            if time.monotonic() >= next_sample and now <= seconds:
                curve.append((now, {k: rss_kb(p.popen.pid) for k, p in procs.items()}))
                print(f"[{now / 60:5.1f} min] " + ", ".join(f"{k} {v / 1024:.1f} MB" for k, v in curve[-1][1].items()),
                      flush=True)
            if time.monotonic() >= stop:
                break
        last_snaps = {f"web{i + 1}": _snapshot(p, snaps) for i, p in enumerate(web)} if traced else {}
        for t in threads:
            t.join(max(1.0, seconds + 120 - (time.monotonic() - t0)))
        elapsed = time.monotonic() - t0
        end_rss = {k: rss_kb(p.popen.pid) for k, p in procs.items()}
        alive = {k: p.alive for k, p in procs.items()}
        print(f"soak: {elapsed:.0f} s, {len(threads)} client threads over 2 web processes, 2 workers")
        print("| process | RSS start (MB) | RSS end (MB) | alive |")
        print("|---|---|---|---|")
        for k in procs:
            print(f"| {k} | {start_rss[k] / 1024:.1f} | {end_rss[k] / 1024:.1f} | {alive[k]} |")
        print("\n| operation | count | errors | p50 ms | p99 ms | max ms |")
        print("|---|---|---|---|---|---|")
        for op in sorted(set(stats.latency) | set(stats.errors)):
            xs = sorted(stats.latency.get(op, [])) or [0.0]
            p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
            print(f"| {op} | {len(stats.latency.get(op, []))} | {stats.errors.get(op, 0)} | "
                  f"{statistics.median(xs) * 1000:.1f} | {p99 * 1000:.1f} | {xs[-1] * 1000:.1f} |")
        for op, examples in stats.examples.items():
            for example in examples:
                print(f"{op} error: {example}")
        print(f"\nmemory curve (MB, every {sample:.0f} s):")
        print("| minute | " + " | ".join(procs) + " |")
        print("|---" * (len(procs) + 1) + "|")
        for at, rss in curve:
            print(f"| {at / 60:.1f} | " + " | ".join(f"{rss[k] / 1024:.1f}" for k in procs) + " |")
        after = [(at, rss) for at, rss in curve if at >= warmup]
        if len(after) >= 2:
            growth = {k: (after[-1][1][k] - after[0][1][k]) / 1024 for k in procs}
            span = (after[-1][0] - after[0][0]) / 60
            print(f"growth after the {warmup / 60:.0f}-minute warm-up, over {span:.0f} minutes: "
                  + ", ".join(f"{k} {g:+.1f} MB" for k, g in growth.items()))
        for name, first in first_snaps.items():
            last = last_snaps.get(name)
            if first and last:
                print(f"\ntracemalloc, {name}: allocation sites that grew most after the warm-up")
                for line in _growth(first, last):
                    print("  " + line)
        tracebacks = {k: p.log_text().count("Traceback") for k, p in procs.items()}
        print(f"\ntracebacks in process logs: {tracebacks}")
    finally:
        teardown()


if __name__ == "__main__":
    main()
