"""Issue 27: two web processes side by side under wrk, in interleaved slices.

Starts the service's stack (PostgreSQL + Redis, as ``bench/e2e_load.py``) and two more web
processes, then drives each in turn with ``--connections`` wrk connections (``bench/wrkload.py``:
a C client, so its own CPU is small and steady), in ``--slices`` interleaved slices of
``--seconds``. This machine's speed drifts by tens of percent within minutes: only slices side by
side compare. Prints per target the requests a second, the web process's CPU per request and
PostgreSQL's (``/proc``), wrk's (its rusage) and the latency p50/p99, summed over all slices, then
the ratios.

The two targets:

- default: uvicorn's stock httptools protocol (``uvicorn-stock``: a response's head and body in
  two ``send()`` calls) against the documented command (``--http
  mcptasks.processes.uvicorn_http:HttpToolsProtocol``: one);
- ``--base PATH``: a web process of another checkout (e.g. a worktree of main; the same
  database schema) against one of this checkout, both on the documented command: before and
  after figures of a change to the request path.

``--method ping`` (default) measures the HTTP path alone; ``--method create`` sends
task-augmented ``tools/call`` of ``demo_sleep`` (the workers then run them; ``--stop-workers``
pauses them, so that only the creations are measured). Every slice opens new sessions, so no
creation repeats an earlier one's request id (which would be an idempotent retry).

Usage::

    apt-get install wrk
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/http_writes.py [--slices 10] [--seconds 3] [--connections 10] \\
        [--method ping|create] [--base PATH] [--stop-workers]
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import wrkload  # noqa: E402
from bench.create_load import CREATE_BODY  # noqa: E402
from bench.e2e_load import TICK, AutovacuumStandIn, _cpu_ticks, _pct, _pg_backends, _start_service  # noqa: E402

BODIES = {"ping": '{"jsonrpc":"2.0","id":%d,"method":"ping"}', "create": CREATE_BODY}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slices", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=10)
    parser.add_argument("--method", choices=tuple(BODIES), default="ping")
    parser.add_argument("--base", type=Path, help="another checkout: its web process against this one's")
    parser.add_argument("--stop-workers", action="store_true", help="pause the workers (SIGSTOP) while measuring")
    parser.add_argument("--autovacuum", type=float, default=10.0, metavar="S",
                        help="stand in for autovacuum every S seconds (see bench/e2e_load.py; 0: none)")
    args = parser.parse_args()
    if not wrkload.available():
        sys.exit("needs wrk (apt-get install wrk)")
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        sys.exit("set DATABASE_URL (PostgreSQL) and REDIS_URL")
    from tests.support import servers

    stack, token, _, pids = _start_service(REPO, 8, "uvicorn")
    dsn = stack.env["DATABASE_URL"]
    standin = AutovacuumStandIn([dsn], args.autovacuum) if args.autovacuum > 0 else None
    if args.base is not None:
        servers.REPO = args.base.resolve()
        first = stack.web(server="uvicorn", embedded_worker=False)
        servers.REPO = REPO
        names = ("base", "this")
    else:
        first = stack.web(server="uvicorn-stock", embedded_worker=False)
        names = ("uvicorn-stock", "documented")
    second = stack.web(server="uvicorn", embedded_worker=False)
    targets = dict(zip(names, (first, second), strict=True))
    totals: dict[str, list] = {name: [0, 0.0, 0.0, 0.0, 0, []] for name in targets}
    print(f"http writes: {args.method}, wrk {args.connections} connections, {args.slices} x {args.seconds} s "
          f"slices per target, interleaved; {' against '.join(names)}; workers "
          f"{'paused' if args.stop_workers else 'running'}; {os.cpu_count()} CPUs", flush=True)
    if args.stop_workers:
        for pid in pids["worker"]:
            os.kill(pid, signal.SIGSTOP)
    try:
        for i in range(args.slices):
            for name in (names[::-1] if i % 2 else names):
                proc = targets[name]
                pg = _pg_backends(dsn)
                watched = [proc.popen.pid, *pg]
                before, r0 = _cpu_ticks(watched), resource.getrusage(resource.RUSAGE_CHILDREN)
                n, latencies, failed = wrkload.run([proc.url], [token], args.connections, args.seconds,
                                                   BODIES[args.method])
                after, r1 = _cpu_ticks(watched), resource.getrusage(resource.RUSAGE_CHILDREN)
                t = totals[name]
                t[0] += n
                t[1] += (after.get(proc.popen.pid, 0) - before.get(proc.popen.pid, 0)) / TICK
                t[2] += sum(after.get(p, 0) - before.get(p, 0) for p in pg) / TICK
                t[3] += r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
                t[4] += failed
                t[5] += latencies
        for name, (n, web, pg_cpu, client, failed, latencies) in totals.items():
            print(f"  {name:<14} {n / (args.slices * args.seconds):8.1f} requests/s | web process "
                  f"{web / n * 1e6:6.1f} us CPU a request | PostgreSQL {pg_cpu / n * 1e6:6.1f} us | wrk "
                  f"{client / n * 1e6:5.1f} us | p50 {statistics.median(latencies):5.1f} / p99 "
                  f"{_pct(latencies, 0.99):5.1f} ms | {failed} failures", flush=True)
        a, b = totals[names[0]], totals[names[1]]
        print(f"  {names[1]} / {names[0]}: requests {b[0] / a[0]:.2f}x, web CPU a request "
              f"{(b[1] / b[0]) / (a[1] / a[0]):.2f}x, PostgreSQL CPU a request "
              f"{(b[2] / b[0]) / (a[2] / a[0]) if a[2] else float('nan'):.2f}x, client CPU a request "
              f"{(b[3] / b[0]) / (a[3] / a[0]):.2f}x", flush=True)
    finally:
        if args.stop_workers:
            for pid in pids["worker"]:
                os.kill(pid, signal.SIGCONT)
        if standin is not None:
            print(standin.stop())
        for proc in targets.values():
            proc.popen.terminate()
        stack.teardown()


if __name__ == "__main__":
    main()
