"""Issue 27 benchmark: task creation at 1, 10 and 50 concurrent clients, next to the SDK peer.

Each client (its own session) sends ``tools/call`` + ``task`` for ``demo_sleep(ms=50)`` in a
closed loop for ``--seconds`` and records the answer time; nothing polls. The clients of a level
are spread over ``--procs`` client processes (default 4, as in ``bench/e2e_load.py``). The service is the
stack of ``bench/e2e_load.py`` (2 web processes under ``--server`` + 2 workers, PostgreSQL + Redis, the tenant without
limits or rates), the peer the official SDK server (``bench/peers/sdk_server.py``); both run the
tasks they accept while the clients create more. Levels and targets interleave: for each level,
the service (one tenant, then ``--tenants``) then the peer. Each of the service's targets starts
once its workers have run the previous target's backlog (creation outpaces 2 workers of 50 ms
tasks). With ``--tenants``, the one-tenant and many-tenant targets run in the order A B B A and
are compared over both of their runs. Prints creations/s and p50/p99 per level and target, and
the ratios. A closed loop of 50 clients measures saturation (each client waits 50 / throughput on
average); ``--open-rates`` adds open-loop levels that offer a fixed rate, to read the latency at a
given load.

Usage (PostgreSQL + Redis as in CI)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/create_load.py [--levels 1,10,50] [--seconds 15] [--procs 4] \\
        [--tenants 20] [--autovacuum S] [--open-rates 150,300 [--open-clients 50]] [--client wrk]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import wrkload  # noqa: E402
from bench.e2e_load import (  # noqa: E402
    TERMINAL,
    TICK,
    AutovacuumStandIn,
    _cpu_ticks,
    _pct,
    _per_role_ms,
    _pg_backends,
    _run_queue_ns,
    _start_service,
    server_autovacuum,
    start_peer,
)
from bench.loadclient import CLIENTS, make_client, open_session  # noqa: E402
from tests.support.servers import PRODUCTION_SERVER, WEB_SERVERS  # noqa: E402

#: The creation every client sends (``%d``: the JSON-RPC id), as :func:`_level` sends it.
CREATE_BODY = ('{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"demo_sleep",'
               '"arguments":{"ms":50},"task":{"ttl":600000}}}')


async def _level(urls: list[str], tokens: list[str], clients: int, seconds: float, *, first: int = 0,
                 start_at: float | None = None, kind: str = "aiohttp", rate: float = 0.0
                 ) -> tuple[int, list[float], int]:
    """``clients`` closed-loop creators for ``seconds`` (client i uses ``tokens[(first + i) % len]``,
    a tenant each), starting at ``start_at`` (wall clock) if given: (creations, latencies in ms,
    failures). With ``rate`` (creations a second for each client) the loop is open: each client
    sends on a fixed schedule and a latency counts from the send's scheduled time, so a reply late
    enough to delay the next send is charged to that one too (no coordinated omission)."""
    latencies: list[float] = []
    failures = 0
    client = make_client(kind, clients * 2)
    try:
        sessions = []
        for i in range(first, first + clients):
            url = urls[i % len(urls)]
            sessions.append((url, await open_session(client, url, tokens[i % len(tokens)])))
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        stop_at = time.monotonic() + seconds

        async def creator(url: str, headers: dict[str, str], phase: float) -> None:
            nonlocal failures
            rid = 0
            due = time.monotonic() + phase
            while time.monotonic() < stop_at:
                rid += 1
                if rate:
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    t0, due = due, due + 1 / rate
                else:
                    t0 = time.monotonic()
                try:
                    reply = await client.post(url, headers, {
                        "jsonrpc": "2.0", "id": rid, "method": "tools/call",
                        "params": {"name": "demo_sleep", "arguments": {"ms": 50}, "task": {"ttl": 600_000}}})
                    if "result" not in reply:
                        raise RuntimeError(str(reply.get("error")))
                    latencies.append((time.monotonic() - t0) * 1000)
                except Exception as exc:  # counted (the first few shown): a server may refuse under load
                    failures += 1
                    if failures <= 3:
                        print(f"  creation failed: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr,
                              flush=True)

        # Open loop: the clients' schedules spread evenly over one interval, not in step.
        # Open loop: the clients' schedules spread over one interval (golden-ratio phases, so
        # clients of different processes do not fall in step), not all sending at once.
        await asyncio.gather(*[creator(*s, ((first + i) * 0.6180339887) % 1.0 / rate if rate else 0.0)
                               for i, s in enumerate(sessions)])
    finally:
        await client.aclose()
    return len(latencies), latencies, failures


def _level_proc(args: tuple[list[str], list[str], int, float, int, float, str, float], queue: Any) -> None:
    urls, tokens, clients, seconds, first, start_at, kind, rate = args
    queue.put(asyncio.run(_level(urls, tokens, clients, seconds, first=first, start_at=start_at, kind=kind,
                                 rate=rate)))


def level(urls: list[str], tokens: list[str], clients: int, seconds: float, procs: int, kind: str,
          rate: float = 0.0) -> tuple[int, list[float], int]:
    """:func:`_level` with the clients spread over up to ``procs`` client processes started
    together (one asyncio process driving 50 connections spent 4 ms of CPU per creation in
    httpx's connection pool, against 1.1 ms at 10: the client, not the server, set the pace)."""
    if procs <= 1 or clients <= 1:
        return asyncio.run(_level(urls, tokens, clients, seconds, kind=kind, rate=rate))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    n = min(procs, clients)
    per = [clients // n + (1 if i < clients % n else 0) for i in range(n)]
    start_at = time.time() + 6.0  # every process has its sessions before the clock starts
    firsts = [sum(per[:i]) for i in range(n)]
    workers = [ctx.Process(target=_level_proc, args=((urls, tokens, k, seconds, first, start_at, kind, rate), queue))
               for k, first in zip(per, firsts, strict=True)]
    for w in workers:
        w.start()
    results = [queue.get(timeout=seconds + 120) for _ in workers]
    for w in workers:
        w.join(30)
    return (sum(r[0] for r in results), [x for r in results for x in r[1]], sum(r[2] for r in results))


def drain(dsn: str, *, limit_s: float = 300.0) -> float:
    """Wait until the service's workers have run every task the last target created (at most
    ``limit_s``): the seconds it took. Each level creates faster than 2 workers run 50 ms tasks,
    so without this the next target starts with the previous one's backlog still running beside
    it (the 20-tenant target, always second, paid for the one-tenant target's backlog)."""
    import psycopg

    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() - started < limit_s:
            row = conn.execute("SELECT count(*) FROM mcptasks_task WHERE status <> ALL(%s)",
                               [list(TERMINAL)]).fetchone()
            if row is None or row[0] == 0:
                break
            time.sleep(0.5)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,10,50")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--procs", type=int, default=4, help="client processes the clients are spread over")
    parser.add_argument("--tenants", type=int, default=1,
                        help="also run each level with the clients spread over this many tenants (each without "
                             "limits), next to the one-tenant run: no global hot row means the same throughput")
    parser.add_argument("--server", choices=tuple(WEB_SERVERS), default=PRODUCTION_SERVER,
                        help=f"the service's web server (default {PRODUCTION_SERVER}, the documented production "
                             "server)")
    parser.add_argument("--client", choices=(*CLIENTS, "wrk"), default="aiohttp",
                        help="the load generator's HTTP client (bench/loadclient.py), or wrk for the closed "
                             "loops (bench/wrkload.py: a C client, so the load generator takes less of the cores "
                             "the servers share with it; the open loops stay on aiohttp)")
    parser.add_argument("--open-rates", default="",
                        help="after the closed-loop levels, open-loop levels at --open-clients clients offering "
                             "these creations a second in all (e.g. 150,300): latency at a given load, not at "
                             "saturation")
    parser.add_argument("--open-clients", type=int, default=50)
    parser.add_argument("--autovacuum", type=float, default=0.0, metavar="S",
                        help="stand in for autovacuum every S seconds (see bench/e2e_load.py)")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        sys.exit("set DATABASE_URL (PostgreSQL) and REDIS_URL")
    if args.client == "wrk" and not wrkload.available():
        sys.exit("--client wrk needs wrk (apt-get install wrk)")
    stack, token, urls, pids = _start_service(REPO, args.concurrency, args.server)
    dsn = stack.env["DATABASE_URL"]
    standin = AutovacuumStandIn([dsn], args.autovacuum) if args.autovacuum > 0 else None
    spread = [token]
    for i in range(1, args.tenants):
        spread.append(stack.token(f"bench{i}", "bencher"))
    if args.tenants > 1:
        stack.manage("shell", "-c", "from tenants.models import Tenant; Tenant.objects.filter(slug__startswith='bench')"
                     ".update(max_concurrent_tasks=None, max_concurrent_tasks_per_principal=None, "
                     "rate_create_per_min=None, rate_read_per_min=None, rate_other_per_min=None)")
    targets: list[tuple[str, list[str], list[str]]] = [("service", urls, [token])]
    if args.tenants > 1:
        # A B B A: the target run second ran on a table the first had grown (and on a machine
        # whose speed drifts): 0.61x one order, 0.96x the other, on the same code.
        many = (f"{args.tenants} tenants", urls, spread)
        targets = [targets[0], many, many, targets[0]]
    peer, peer_url = start_peer()
    targets.append(("peer", [peer_url], [""]))
    try:
        print(f"creation load: {args.seconds:.0f} s per level and target (closed loops unless said), "
              "demo_sleep 50 ms tasks; "
              f"service: 2 {args.server} + 2 workers x {args.concurrency}; peer: mcp SDK, 1 uvicorn; "
              f"{os.cpu_count()} CPUs; client {args.client}; PostgreSQL autovacuum {server_autovacuum(dsn)}"
              + (f", stand-in every {args.autovacuum:g} s" if standin else ""),
              flush=True)
        plan = [(int(x), 0.0) for x in args.levels.split(",") if x]
        plan += [(args.open_clients, float(x)) for x in args.open_rates.split(",") if x]
        for clients, offered in plan:
            got = {}
            if offered:
                print(f"  open loop: {clients} clients offering {offered:g} creations/s in all", flush=True)
            runs: dict[str, tuple[int, list[float]]] = {}
            for name, target, toks in targets:
                if name != "peer":
                    waited = drain(dsn)
                    if waited >= 1:
                        print(f"  (waited {waited:.0f} s for the service's backlog to drain)", flush=True)
                roles = {**pids, "postgres": _pg_backends(dsn)} if name != "peer" else {}
                counted = [pid for group in roles.values() for pid in group]
                ticks, waited = _cpu_ticks(counted), _run_queue_ns(counted)
                if args.client == "wrk" and not offered:
                    n, lat, failed = wrkload.run(target, toks, clients, args.seconds, CREATE_BODY)
                else:
                    n, lat, failed = level(target, toks, clients, args.seconds, args.procs,
                                           "aiohttp" if args.client == "wrk" else args.client, offered / clients)
                after, waited_after = _cpu_ticks(counted), _run_queue_ns(counted)
                load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
                # Over the whole target (its clients' set-up included): to compare targets, not absolute.
                cpu = ", ".join(f"{role} {ms:.2f}" for role, ms in
                                _per_role_ms(roles, ticks, after, scale=TICK, n=n).items()) if n else ""
                wait = ", ".join(f"{role} {ms:.2f}" for role, ms in
                                 _per_role_ms(roles, waited, waited_after, scale=1e9, n=n).items()) if n else ""
                print(f"  {clients:3d} clients  {name:<8} {n / args.seconds:7.1f} creations/s | "
                      f"p50 {statistics.median(lat) if lat else float('nan'):6.1f} ms | "
                      f"p99 {_pct(lat, 0.99):6.1f} ms | {failed} failures | load {load}"
                      + (f" | CPU ms/creation: {cpu}" if cpu else "")
                      + (f" | waiting for a core ms/creation: {wait}" if wait else ""), flush=True)
                before = runs.get(name, (0, []))
                runs[name] = (before[0] + n, before[1] + lat)
            for name, (n, lat) in runs.items():
                times = sum(1 for t in targets if t[0] == name)
                got[name] = (n / (args.seconds * times), statistics.median(lat) if lat else float("nan"),
                             _pct(lat, 0.99))
            if args.tenants > 1:
                for name in ("service", f"{args.tenants} tenants"):
                    print(f"  {clients:3d} clients  {name:<8} over both runs: {got[name][0]:7.1f} creations/s | "
                          f"p50 {got[name][1]:6.1f} ms | p99 {got[name][2]:6.1f} ms", flush=True)
            s, p = got["service"], got["peer"]
            print(f"  {clients:3d} clients  service/peer: throughput {s[0] / p[0]:.2f}x, p50 {s[1] / p[1]:.2f}x, "
                  f"p99 {s[2] / p[2]:.2f}x", flush=True)
            if args.tenants > 1:
                m = got[f"{args.tenants} tenants"]
                print(f"  {clients:3d} clients  {args.tenants} tenants / 1 tenant: throughput {m[0] / s[0]:.2f}x, "
                      f"p50 {m[1] / s[1]:.2f}x, p99 {m[2] / s[2]:.2f}x", flush=True)
    finally:
        if standin is not None:
            print(standin.stop())
        peer.kill()
        peer.wait(10)
        stack.teardown()


if __name__ == "__main__":
    main()
