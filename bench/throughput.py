"""Issue 14 benchmark: worker throughput, in bulk and through HTTP next to the SDK peer.

``bulk``: N trivial tasks (``test_tick``) enqueued at once, then W workers of concurrency C
started; reports tasks/s from the first worker's start until none is live (and, without the
workers' start-up, from the first run's start to the last one's end), then checks that
every task completed exactly once (one attempt, the tool's own output) and that the audit
chains verify (``mcptasks_audit seal`` + ``verify``).

``http``: T tasks of ``demo_sleep(ms=50)`` created through ``tools/call`` + ``task`` by K
concurrent clients spread over 2 daphne processes (2 workers), each awaited with
``tasks/result``; reports tasks/s and the end-to-end time beyond the 50 ms (p50, p99). The
same load runs against the official Python SDK peer (``bench/peers/sdk_server.py``: mcp 1.30,
in-memory store, one uvicorn process) in the same run.

Usage (PostgreSQL + Redis as in CI)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/throughput.py bulk [N] [WORKERS] [CONCURRENCY] [--repo PATH]
    ... bench/throughput.py http [TASKS] [CLIENTS]

``--repo PATH`` runs the bulk benchmark against another checkout (e.g. an older commit in a
``git worktree``) with this script, for before/after figures in one run.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ARGS = [a for a in sys.argv[1:] if not a.startswith("--repo")]
REPO = Path(__file__).resolve().parents[1]
for i, a in enumerate(sys.argv):
    if a == "--repo":
        REPO = Path(sys.argv[i + 1]).resolve()
        ARGS.remove(sys.argv[i + 1])
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from tests.support.servers import FAST_SETTINGS, free_port, make_stack  # noqa: E402

ACCEPT = "application/json, text/event-stream"


def _production_env(stack: Any) -> None:
    for key in ("MCPTASKS_ALLOW_ANONYMOUS", *FAST_SETTINGS):
        stack.env.pop(key, None)
    stack.env["DEBUG"] = "0"  # DEBUG records every query: not what production runs
    stack.env["MCPTASKS_AUDIT_KEY"] = "bench-audit-key"


def bulk(n: int, workers: int, concurrency: int) -> None:
    import psycopg

    work = Path(tempfile.mkdtemp(prefix="bench-bulk-"))
    stack, teardown = make_stack(work)
    _production_env(stack)
    try:
        stack.manage("mcptasks_enqueue", "test_tick", "--count", str(n), "--arguments", '{"n": 1}')
        dsn = stack.env["DATABASE_URL"]
        started = time.monotonic()
        procs = [stack.worker(concurrency=concurrency) for _ in range(workers)]
        with psycopg.connect(dsn, autocommit=True) as conn:
            while conn.execute("SELECT count(*) FROM mcptasks_task WHERE status IN ('working', 'input_required')"
                               ).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.05)
            elapsed = time.monotonic() - started
            rows = conn.execute("SELECT status, attempt, result->'content'->0->>'text' FROM mcptasks_task").fetchall()
            # The workers' own pace, without their start-up (importing Django, connecting): from
            # the first run's start to the last one's end, as the tasks recorded them.
            span = conn.execute("SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM mcptasks_task"
                                ).fetchone()[0]  # type: ignore[index]
        for p in procs:
            p.terminate(timeout=30)
        exactly_once = (len(rows) == n and all(r[0] == "completed" and r[1] == 1 and r[2] == "tick 1 attempt 1"
                                               for r in rows))
        try:
            stack.manage("mcptasks_audit", "seal")
            verified = stack.manage("mcptasks_audit", "verify").stdout.strip().replace("\n", "; ")
        except subprocess.CalledProcessError as exc:
            verified = f"not verified ({(exc.stdout or exc.stderr or '').strip()[-200:]})"
        running = f"{n / float(span):.0f} tasks/s from the first run's start to the last one's end" if span else "-"
        print(f"bulk: {n} tasks, {workers} workers x {concurrency}: {elapsed:.1f} s = {n / elapsed:.0f} tasks/s "
              f"from the first worker's start ({running}); exactly once: {exactly_once}; audit: {verified}")
    finally:
        teardown()


# --- through HTTP -----------------------------------------------------------------------------


async def _post(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """POST one request; the JSON-RPC response with its id (JSON or SSE)."""
    async with client.stream("POST", url, headers=headers, json=body) as resp:
        if resp.status_code >= 400:
            raise RuntimeError(f"{body['method']}: HTTP {resp.status_code} {(await resp.aread())[:300]!r}")
        if resp.headers.get("content-type", "").startswith("application/json"):
            return dict(json.loads(await resp.aread()))
        seen = []
        async for line in resp.aiter_lines():
            seen.append(line)
            if line.startswith("data:") and line[5:].strip():
                msg = json.loads(line[5:])
                if msg.get("id") == body.get("id") and ("result" in msg or "error" in msg):
                    return dict(msg)
    raise RuntimeError(f"{body['method']}: stream ended without a response: {seen[-5:]}")


async def _sessions(client: httpx.AsyncClient, urls: list[str], token: str) -> list[tuple[str, dict[str, str]]]:
    base = {"Accept": ACCEPT, "Content-Type": "application/json"}
    if token:
        base["Authorization"] = f"Bearer {token}"
    sessions = []
    for url in urls:
        resp = await client.post(url, headers=base, json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "bench", "version": "1"}}})
        resp.raise_for_status()
        headers = {**base, "Mcp-Session-Id": resp.headers.get("mcp-session-id", ""),
                   "MCP-Protocol-Version": "2025-11-25"}
        await client.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        sessions.append((url, headers))
    return sessions


async def _one(client: httpx.AsyncClient, sessions: list[tuple[str, dict[str, str]]], job: int) -> float:
    """Create a task on one process, await it with tasks/result through the other; ms beyond 50."""
    (url_a, h_a), (url_b, h_b) = sessions[job % len(sessions)], sessions[(job + 1) % len(sessions)]
    t0 = time.monotonic()
    created = await _post(client, url_a, h_a, {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "demo_sleep", "arguments": {"ms": 50}, "task": {"ttl": 600_000}}})
    task_id = created["result"]["task"]["taskId"]
    while True:
        done = await _post(client, url_b, h_b, {"jsonrpc": "2.0", "id": 2, "method": "tasks/result",
                                                "params": {"taskId": task_id}})
        # FastMCP answers tasks/result at once, with an error until the task is done (it does
        # not block as the spec asks): ask again every 20 ms, far below its pollInterval.
        if "not completed" not in str(done.get("error", {}).get("message", "")):
            break
        await asyncio.sleep(0.02)
    if "error" in done:
        raise RuntimeError(f"task failed: {done['error']}")
    return (time.monotonic() - t0) * 1000 - 50


async def _client(urls: list[str], token: str, jobs: asyncio.Queue[int], lat: list[float],
                  failures: list[str]) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        sessions = await _sessions(client, urls, token)
        while not jobs.empty():
            job = jobs.get_nowait()
            try:
                lat.append(await _one(client, sessions, job))
            except Exception as exc:  # counted and reported, not fatal: a server may fail under load
                failures.append(f"{type(exc).__name__}: {str(exc)[:160]}")


async def _load(urls: list[str], token: str, tasks: int, clients: int) -> tuple[float, list[float], list[str]]:
    jobs: asyncio.Queue[int] = asyncio.Queue()
    for i in range(tasks):
        jobs.put_nowait(i)
    lat: list[float] = []
    failures: list[str] = []
    t0 = time.monotonic()
    await asyncio.gather(*[_client(urls, token, jobs, lat, failures) for _ in range(clients)])
    return time.monotonic() - t0, lat, failures


def _report(name: str, tasks: int, elapsed: float, lat: list[float], failures: list[str]) -> None:
    if failures:
        print(f"http {name}: {len(failures)} of {tasks} tasks failed, e.g. {failures[0]}")
    if not lat:
        return
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"http {name}: {len(lat)} tasks in {elapsed:.1f} s = {len(lat) / elapsed:.0f} tasks/s; "
          "overhead beyond 50 ms: "
          f"p50 {statistics.median(lat):.0f} ms, p99 {p99:.0f} ms")


def http(tasks: int, clients: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-http-"))
    stack, teardown = make_stack(work)
    _production_env(stack)
    procs: list[Any] = []
    try:
        token = stack.token("bench", "bencher")
        stack.manage("shell", "-c", "from tenants.models import Tenant; Tenant.objects.filter(slug='bench')"
                     ".update(max_concurrent_tasks=None, max_concurrent_tasks_per_principal=None)")
        webs = [stack.daphne(embedded_worker=False) for _ in range(2)]
        procs += webs + [stack.worker(concurrency=64) for _ in range(2)]
        _report("mcptasks (2 daphne, 2 workers, PostgreSQL + Redis)", tasks,
                *asyncio.run(_load([w.url for w in webs], token, tasks, clients)))
    finally:
        for p in procs:
            p.terminate(timeout=20)
        teardown()
    _peer("sdk peer (mcp 1.30, in-memory, 1 uvicorn)", [sys.executable, str(REPO / "bench/peers/sdk_server.py")],
          tasks, clients)
    fastmcp_python = _fastmcp_venv()
    if fastmcp_python is not None:
        _peer("fastmcp peer (FastMCP 3.4, Docket in memory, 1 uvicorn)",
              [str(fastmcp_python), str(REPO / "bench/peers/fastmcp_server.py")], tasks, clients)


def _fastmcp_venv() -> Path | None:
    """FastMCP pins its own ``mcp``: it gets a virtualenv of its own (created once)."""
    venv = REPO / "var" / "bench-fastmcp"
    python = venv / "bin" / "python"
    if not python.exists():
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", "fastmcp[tasks]>=3.4,<3.5", "uvicorn"],
                           check=True)
        except subprocess.CalledProcessError as exc:
            print(f"http fastmcp peer: not measured (could not install FastMCP: {exc})")
            return None
    return python


def _peer(name: str, command: list[str], tasks: int, clients: int) -> None:
    port = free_port()
    peer = subprocess.Popen([*command, str(port)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        _report(name, tasks, *asyncio.run(_load([url], "", tasks, clients)))
    finally:
        peer.kill()
        peer.wait(10)


def main() -> None:
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        sys.exit("set DATABASE_URL (PostgreSQL) and REDIS_URL")
    mode = ARGS[0] if ARGS else "bulk"
    nums = [int(a) for a in ARGS[1:]]
    if mode == "bulk":
        bulk(*(nums + [10_000, 2, 64][len(nums):]))
    elif mode == "http":
        http(*(nums + [2_000, 50][len(nums):]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
