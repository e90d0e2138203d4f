"""Issue 13 benchmark: tasks/get throughput and latency, mcptasks next to its peers, in one run.

Each server gets core 0 (``taskset``), wrk gets core 1, so the client does not steal the
server's CPU. For every server a session is opened and one task created; wrk then POSTs
``tasks/get`` for it over 32 connections (and 1) for a few seconds. Servers:

- ``sdk``: the official Python SDK peer (``bench/peers/sdk_server.py``: mcp 1.30 low-level server,
  ``enable_tasks()``, in-memory store) under uvicorn, with JSON responses and (``sdk SSE``) SSE
  responses; ``fastmcp``: FastMCP 3.4 (``bench/peers/fastmcp_server.py``, in-memory task
  backend). Each peer runs from a virtualenv of its own (``bench/.venvs/``, made on first use);
  ratios are against the best peer of the run;
- ``bare``: a Channels consumer that answers a constant (``bench/peers/bare_consumer.py``)
  under daphne, the ceiling of any Channels app there;
- ``mcptasks``: one daphne process on PostgreSQL + Redis with a real bearer token, the full auth
  and rate-limit path, and a separate worker (it runs the tool, not the request path);
- ``mcptasks-uvicorn``: the same application under uvicorn; ``mcptasks-granian``: under granian.

Usage (PostgreSQL and Redis as in CI; needs ``wrk`` and ``taskset``)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/tasks_get.py [SECONDS]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.client import ACCEPT_BOTH  # noqa: E402
from tests.support.servers import FAST_SETTINGS, Proc, free_port, make_stack  # noqa: E402

#: Rounds of tasks/get measurements (the issue: the median of at least three), warm-up per server.
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
WARMUP_S = 3.0
#: The servers also measured on creation, tasks/result, tasks/list and initialize (50 connections).
OTHERS_FOR = ("sdk (mcp 1.30, uvicorn)", "mcptasks (daphne)", "mcptasks (granian)")

LUA = """
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2025-11-25"
local sid = os.getenv("BENCH_SID")
if sid and sid ~= "" then wrk.headers["Mcp-Session-Id"] = sid end
local auth = os.getenv("BENCH_AUTH")
if auth and auth ~= "" then wrk.headers["Authorization"] = auth end
"""


def _peer_python(name: str, requirements: list[str]) -> str:
    """The Python of a peer's own virtualenv (``bench/.venvs/NAME``), made on first use."""
    venv = REPO / "bench" / ".venvs" / name
    python, marker = venv / "bin" / "python", venv / "requirements.txt"
    wanted = "\n".join(requirements)
    if not python.exists() or not marker.exists() or marker.read_text() != wanted:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True)
        marker.write_text(wanted)
    return str(python)


def _json(resp: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a response, JSON or a one-event SSE stream."""
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in resp.text.splitlines() if line.startswith("data:")]
        return dict(json.loads(next(d for d in data if d)))
    return dict(resp.json())


def _session(url: str, token: str | None) -> tuple[str, str]:
    """Open a session and create one task; returns (session id, task id)."""
    headers = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    init = httpx.post(url, headers=headers, timeout=30, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "bench", "version": "1"}},
    })
    init.raise_for_status()
    sid = init.headers.get("mcp-session-id", "")
    headers = {**headers, "Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"}
    httpx.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, timeout=30)
    created = httpx.post(url, headers=headers, timeout=30, json={
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "demo_sleep", "arguments": {"ms": 1}, "task": {"ttl": 3_600_000}},
    })
    created.raise_for_status()
    task_id = _json(created)["result"]["task"]["taskId"]
    check = httpx.post(url, headers=headers, timeout=30,
                       json={"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"taskId": task_id}})
    assert _json(check)["result"]["taskId"] == task_id, check.text
    return sid, task_id


def _wrk(url: str, *, connections: int, seconds: float, env: dict[str, str], script: Path) -> dict[str, float]:
    out = subprocess.run(
        ["taskset", "-c", "1", "wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds:g}s", "--latency",
         "-s", str(script), url],
        capture_output=True, text=True, env={**os.environ, **env}, check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)

    def pct(p: str) -> float:
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)$", out, re.M)
        if not m:
            return float("nan")
        value, unit = float(m.group(1)), m.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    # Connections the server refused, reset or left unanswered: wrk reports them apart from
    # non-2xx answers, and a server that drops connections looks fast in p50 otherwise.
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {"rps": rps, "p50": pct("50"), "p99": pct("99"), "non2xx": float(errors.group(1)) if errors else 0.0,
            "sockerr": float(sum(int(x) for x in sock.groups())) if sock else 0.0}


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen(["taskset", "-c", "0", *args], cwd=REPO, env={**os.environ, **env},
                                stdout=fh, stderr=subprocess.STDOUT)


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited:\n{log.read_text()}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not start:\n{log.read_text()}")


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is required (apt-get install wrk util-linux)")
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        sys.exit("set DATABASE_URL (PostgreSQL) and REDIS_URL")
    work = Path(tempfile.mkdtemp(prefix="bench-"))
    script = work / "tasks_get.lua"
    script.write_text(LUA)
    stack, teardown = make_stack(work)
    for key in ("MCPTASKS_EXTRA_APPS", "MCPTASKS_ALLOW_ANONYMOUS", *FAST_SETTINGS):
        stack.env.pop(key, None)
    stack.env["DEBUG"] = "0"  # DEBUG records every query: not what production runs
    procs: list[subprocess.Popen[bytes]] = []
    results: list[tuple[str, int, dict[str, float]]] = []
    others: list[tuple[str, str, dict[str, float]]] = []
    per_round: dict[tuple[str, int], list[float]] = {}
    try:
        token = stack.token("bench", "bencher")
        # Limits far above the load: every request takes the full rate-limit path (counters in
        # Redis, the pollInterval note for tasks/get) without being refused.
        import psycopg

        with psycopg.connect(stack.env["DATABASE_URL"], autocommit=True) as db:
            db.execute("UPDATE tenants_tenant SET rate_read_per_min = 100000000, rate_create_per_min = 100000000, "
                       "rate_other_per_min = 100000000 WHERE slug = 'bench'")
        worker: Proc = stack.worker(concurrency=8)
        del worker
        servers: list[tuple[str, list[str], dict[str, str], str, str | None]] = []
        port = free_port()
        sdk_python = _peer_python("sdk", ["mcp==1.30.0", "uvicorn>=0.30"])
        servers.append(("sdk (mcp 1.30, uvicorn)", [sdk_python, "bench/peers/sdk_server.py", str(port)], {},
                        f"http://127.0.0.1:{port}/mcp", None))
        port = free_port()
        servers.append(("sdk SSE (mcp 1.30, uvicorn)", [sdk_python, "bench/peers/sdk_server.py", str(port), "sse"],
                        {}, f"http://127.0.0.1:{port}/mcp", None))
        port = free_port()
        servers.append(("fastmcp (3.4, uvicorn)",
                        [_peer_python("fastmcp", ["fastmcp[tasks]>=3.4,<4"]), "bench/peers/fastmcp_server.py",
                         str(port)], {}, f"http://127.0.0.1:{port}/mcp", None))
        port = free_port()
        servers.append(("bare Channels consumer (daphne)",
                        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                         "bench.peers.bare_consumer:application"], stack.env, f"http://127.0.0.1:{port}/", "bare"))
        port = free_port()
        servers.append(("bare Channels consumer (granian)",
                        [sys.executable, "-m", "granian", "--interface", "asginl", "--host", "127.0.0.1",
                         "--port", str(port), "--workers", "1", "--log-level", "warning",
                         "bench.peers.bare_consumer:application"], stack.env, f"http://127.0.0.1:{port}/", "bare"))
        port = free_port()
        servers.append(("mcptasks (daphne)",
                        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                         "mcptasks.asgi:application"],
                        {**stack.env, "MCPTASKS_EMBEDDED_WORKER": "0"}, f"http://127.0.0.1:{port}/mcp", token))
        port = free_port()
        servers.append(("mcptasks (uvicorn)",
                        [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port),
                         "--log-level", "warning", "mcptasks.asgi:application"],
                        {**stack.env, "MCPTASKS_EMBEDDED_WORKER": "0"}, f"http://127.0.0.1:{port}/mcp", token))
        port = free_port()
        servers.append(("mcptasks (granian)",
                        [sys.executable, "-m", "granian", "--interface", "asginl", "--host", "127.0.0.1",
                         "--port", str(port), "--workers", "1", "--log-level", "warning",
                         "mcptasks.asgi:application"],
                        {**stack.env, "MCPTASKS_EMBEDDED_WORKER": "0"}, f"http://127.0.0.1:{port}/mcp", token))
        # Every server is started first (an idle one costs nothing), then measured in rounds:
        # each round measures every server once, so slow drift on this shared machine (other
        # processes, PostgreSQL's own work) touches peers and mcptasks alike; medians of the rounds.
        targets: list[tuple[str, str, dict[str, str], str | None, str | None]] = []
        only = [x.strip() for x in os.environ.get("BENCH_SERVERS", "").split(",") if x.strip()]
        if only:  # a quick partial run: only the servers whose label starts with one of these
            servers = [srv for srv in servers if srv[0].startswith(tuple(only))]
        for label, args, env, url, auth in servers:
            log = work / f"{label.split()[0]}-{len(procs)}.log"
            proc = _spawn(args, env, log)
            procs.append(proc)
            _wait(url, proc, log)
            task_id = None
            if auth == "bare":
                wrk_env = {"BENCH_BODY": '{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"x"}}'}
            else:
                sid, task_id = _session(url, auth)
                wrk_env = {"BENCH_SID": sid, "BENCH_AUTH": f"Bearer {auth}" if auth else "",
                           "BENCH_BODY": json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tasks/get",
                                                     "params": {"taskId": task_id}})}
            _wrk(url, connections=8, seconds=WARMUP_S, env=wrk_env, script=script)  # warm-up
            targets.append((label, url, wrk_env, auth, task_id))
        rounds: dict[tuple[str, int], list[dict[str, float]]] = {}
        for round_no in range(1, ROUNDS + 1):
            for connections in (32, 1):
                for label, url, wrk_env, _auth, _task in targets:
                    got = _wrk(url, connections=connections, seconds=seconds, env=wrk_env, script=script)
                    rounds.setdefault((label, connections), []).append(got)
                    print(f"round {round_no}: {label} at {connections} connections: {got}", flush=True)
        for (label, connections), runs in rounds.items():
            results.append((label, connections, _median_run(runs)))
            per_round[(label, connections)] = [r["rps"] for r in runs]
        for label, url, wrk_env, auth, task_id in targets:
            if auth == "bare" or task_id is None or label not in OTHERS_FOR:
                continue
            for method, body, with_session in _other_methods(task_id):
                env = {**wrk_env, "BENCH_BODY": json.dumps(body)}
                if not with_session:
                    env["BENCH_SID"] = ""
                # Task creation at 1, 10 and 50 clients (benchmark (b)); the others at 50.
                for connections in ((1, 10, 50) if method.startswith("tools/call") else (50,)):
                    got = _wrk(url, connections=connections, seconds=seconds, env=env, script=script)
                    others.append((label, f"{method} [{connections}]", got))
                    print(f"measured {label} {method} at {connections} connections: {got}", flush=True)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        teardown()
    # Ours against the best peer of each row's connection count.
    peer: dict[int, float] = {}
    for label, c, r in results:
        if label.startswith(("sdk", "fastmcp")):
            peer[c] = max(peer.get(c, 0.0), r["rps"])
    # The ceiling under the same server: each mcptasks row is compared with the bare consumer
    # under its own server where one was measured (daphne otherwise).
    bare = {(label.split("(")[1], c): r["rps"] for label, c, r in results if label.startswith("bare")}

    def ceiling(label: str, c: int) -> float:
        server = label.split("(")[1] if "(" in label else ""
        return bare.get((server, c), bare.get(("daphne)", c), float("nan")))

    print(f"\ntasks/get: the median of {ROUNDS} rounds of {seconds:g} s (each round's req/s under 'rounds')")
    print("| server | connections | tasks/get req/s | rounds | p50 ms | p99 ms | non-2xx | socket errors "
          "| vs best peer | vs bare consumer (same server) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, c, r in results:
        each = ", ".join(f"{x:.0f}" for x in per_round[(label, c)])
        best = peer.get(c, float("nan"))
        print(f"| {label} | {c} | {r['rps']:.0f} | {each} | {r['p50']:.2f} | {r['p99']:.2f} | {r['non2xx']:.0f} | "
              f"{r['sockerr']:.0f} | {r['rps'] / best:.2f}x | {r['rps'] / ceiling(label, c):.2f}x |")
    print()
    print("| server | request [connections] | req/s | p50 ms | p99 ms | non-2xx | socket errors |")
    print("|---|---|---|---|---|---|---|")
    for label, method, r in others:
        print(f"| {label} | {method} | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['non2xx']:.0f} | "
              f"{r['sockerr']:.0f} |")


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run with the median throughput (its latencies with it)."""
    ordered = sorted(runs, key=lambda r: r["rps"])
    return ordered[len(ordered) // 2]


def _other_methods(task_id: str) -> list[tuple[str, dict[str, object], bool]]:
    """(label, JSON-RPC body, sent in the session) of the other measured requests."""
    return [
        ("tools/call with task (CreateTaskResult)",
         {"jsonrpc": "2.0", "id": 8, "method": "tools/call",
          "params": {"name": "demo_sleep", "arguments": {"ms": 1}, "task": {"ttl": 60_000}}}, True),
        ("tasks/result of a completed task", {"jsonrpc": "2.0", "id": 9, "method": "tasks/result",
                                              "params": {"taskId": task_id}}, True),
        ("tasks/list (first page)", {"jsonrpc": "2.0", "id": 10, "method": "tasks/list", "params": {}}, True),
        ("initialize", {"jsonrpc": "2.0", "id": 11, "method": "initialize",
                        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                   "clientInfo": {"name": "bench", "version": "1"}}}, False),
    ]


if __name__ == "__main__":
    main()
