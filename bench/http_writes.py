"""Issue 27: what one write per response saves, uvicorn's own protocol against the documented one.

Starts the service's stack (PostgreSQL + Redis, as ``bench/e2e_load.py``) with one web process
on uvicorn's stock httptools protocol (``uvicorn-stock``: a response's head and body in two
``send()`` calls) and one on the documented command (``--http
mcptasks.processes.uvicorn_http:HttpToolsProtocol``: one). wrk (Debian's package: a C client,
so its own CPU is small and steady) drives each in turn with ``--connections`` connections, in
``--slices`` interleaved slices of ``--seconds`` (this machine's speed drifts by tens of percent
within minutes: only slices side by side compare). Prints per target the requests, the web
process's CPU per request (``/proc``) and wrk's (its rusage), summed over all slices.

``--method ping`` (default) measures the HTTP path alone; ``--method create`` sends
task-augmented ``tools/call`` of ``demo_sleep`` (the workers then run them).

Usage::

    apt-get install wrk
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/http_writes.py [--slices 10] [--seconds 3] [--connections 10] [--method ping]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.e2e_load import TICK, _cpu_ticks, _start_service  # noqa: E402
from bench.loadclient import make_client, open_session  # noqa: E402

BODIES = {
    "ping": '{"jsonrpc":"2.0","id":%d,"method":"ping"}',
    "create": '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"demo_sleep",'
              '"arguments":{"ms":50},"task":{"ttl":600000}}}',
}

# Each request a new id, the sessions taken in turn; an answer without "result" is a failure.
LUA = r"""
local headers, n = {}, 0
failures = 0
function init(args)
  local token = os.getenv("WRK_TOKEN") or ""
  for s in string.gmatch(os.getenv("WRK_SESSIONS") or "", "[^,]+") do
    local h = {["Content-Type"]="application/json", ["Accept"]="application/json, text/event-stream",
               ["Mcp-Session-Id"]=s, ["MCP-Protocol-Version"]="2025-11-25"}
    if token ~= "" then h["Authorization"] = "Bearer " .. token end
    table.insert(headers, h)
  end
end
function request()
  n = n + 1
  return wrk.format("POST", nil, headers[(n % #headers) + 1], string.format(os.getenv("WRK_BODY"), n))
end
function response(status, hdrs, body)
  if status ~= 200 or not string.find(body, '"result"', 1, true) then failures = failures + 1 end
end
local threads = {}
function setup(thread) table.insert(threads, thread) end
function done(summary, latency, requests)
  local f = 0
  for _, t in ipairs(threads) do f = f + t:get("failures") end
  io.write(string.format("RESULT %d %d %d\n", summary.requests, f, latency:percentile(50)))
end
"""


async def _sessions(url: str, token: str, count: int) -> list[str]:
    client = make_client("aiohttp", 4)
    try:
        return [(await open_session(client, url, token))["Mcp-Session-Id"] for _ in range(count)]
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slices", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=10)
    parser.add_argument("--method", choices=tuple(BODIES), default="ping")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("needs wrk (apt-get install wrk)")
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        sys.exit("set DATABASE_URL (PostgreSQL) and REDIS_URL")
    stack, token, urls, pids = _start_service(REPO, 8, "uvicorn-stock")
    documented = stack.web(server="uvicorn", embedded_worker=False)
    script = Path(tempfile.mkdtemp(prefix="bench-writes-")) / "mcp.lua"
    script.write_text(LUA)
    targets = {"uvicorn-stock": (urls[0], pids["web"][:1]), "documented": (documented.url, [documented.popen.pid])}
    totals = {name: [0, 0.0, 0.0, 0] for name in targets}
    print(f"http writes: {args.method}, wrk {args.connections} connections, {args.slices} x {args.seconds} s "
          f"slices per target, interleaved; {os.cpu_count()} CPUs", flush=True)
    try:
        for i in range(args.slices):
            for name, (url, procs) in (list(targets.items())[::-1] if i % 2 else targets.items()):
                sessions = asyncio.run(_sessions(url, token, args.connections))
                env = {**os.environ, "WRK_TOKEN": token, "WRK_SESSIONS": ",".join(sessions),
                       "WRK_BODY": BODIES[args.method]}
                before, r0 = _cpu_ticks(procs), resource.getrusage(resource.RUSAGE_CHILDREN)
                out = subprocess.run(["wrk", "-t1", f"-c{args.connections}", f"-d{args.seconds}s", "-s", str(script),
                                      url], env=env, capture_output=True, text=True, check=True).stdout
                after, r1 = _cpu_ticks(procs), resource.getrusage(resource.RUSAGE_CHILDREN)
                line = next(x for x in out.splitlines() if x.startswith("RESULT"))
                n, failed = int(line.split()[1]), int(line.split()[2])
                t = totals[name]
                t[0] += n
                t[1] += sum(after.get(p, 0) - before.get(p, 0) for p in procs) / TICK
                t[2] += r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
                t[3] += failed
        for name, (n, server, client, failed) in totals.items():
            print(f"  {name:<14} {n / (args.slices * args.seconds):8.1f} requests/s | web process "
                  f"{server / n * 1e6:6.1f} us CPU a request | wrk {client / n * 1e6:5.1f} us | {failed} failures",
                  flush=True)
        (ns, ss, cs, _), (nd, sd, cd, _) = totals["uvicorn-stock"], totals["documented"]
        print(f"  documented / stock: requests {nd / ns:.2f}x, web CPU a request {(sd / nd) / (ss / ns):.2f}x, "
              f"client CPU a request {(cd / nd) / (cs / ns):.2f}x", flush=True)
    finally:
        documented.popen.terminate()
        stack.teardown()


if __name__ == "__main__":
    main()
