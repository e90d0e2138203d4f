"""Issue 13 profiling aid: the application's own cost per ``tasks/get``, without an HTTP server.

Drives ``mcptasks.asgi:application`` and the bare Channels consumer
(``bench/peers/bare_consumer.py``) with in-process ASGI calls on PostgreSQL + Redis, a real
bearer token and the full auth and rate-limit path, and prints microseconds of CPU time per
request for each (one client at a time, then ``CONCURRENCY`` at once). The ratio says how much
of a request is the application rather than the server; ``--profile`` writes a cProfile of the
mcptasks run to ``bench-inproc.prof``; ``--create`` also measures ``tools/call`` creating tasks (no worker runs
them: they stay ``working``).

Usage (a scratch database: it is migrated and written to)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/h4 REDIS_URL=redis://127.0.0.1:6379/4 \\
        .venv/bin/python bench/inproc.py [REQUESTS] [--profile] [--create]

``BENCH_TREE=/path/to/checkout`` measures that checkout's application instead of this one's.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

# BENCH_TREE: measure another checkout (e.g. the code a change replaces) with this same script.
REPO = Path(os.environ.get("BENCH_TREE") or Path(__file__).resolve().parents[1]).resolve()
sys.path.insert(0, str(REPO))
os.environ.setdefault("SECRET_KEY", "bench-" + secrets.token_hex(16))
os.environ.setdefault("DEBUG", "0")
os.environ.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost")
os.environ.setdefault("MCPTASKS_EMBEDDED_WORKER", "0")
# The benchmark calls demo_sleep (off by default) from one tenant, far past the default quota.
os.environ.setdefault("MCPTASKS_DEMO_TOOLS", "1")
os.environ.setdefault("MCPTASKS_TASK_MAX_CONCURRENT", "0")
os.environ.setdefault("MCPTASKS_CHANNEL_PREFIX", "inproc" + secrets.token_hex(3))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mcptasks.settings")

CONCURRENCY = 32


def _scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
    }


async def call(
    app: Any, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[int, dict[str, str], bytes]:
    """One request through the ASGI app; returns (status, headers, body)."""
    delivered = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()
        return {"type": "http.disconnect"}

    status, out_headers, chunks = 0, {}, []
    done = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, out_headers
        if message["type"] == "http.response.start":
            status = message["status"]
            out_headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                done.set()

    # As a server does, the answer is complete when its last body part is sent; the application
    # may still be winding down (a Channels consumer cancels its channel-layer receive).
    app_task = asyncio.ensure_future(app(_scope(path, headers), receive, send))
    _pending.add(app_task)
    app_task.add_done_callback(_pending.discard)
    await done.wait()
    return status, out_headers, b"".join(chunks)


_pending: set[asyncio.Future[Any]] = set()


def _setup() -> tuple[str, list[tuple[bytes, bytes]]]:
    """Migrate, create a tenant with limits far above the load, mint a token."""
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from tenants import services as tenant_services
    from tenants.models import Tenant

    slug = "inproc-" + secrets.token_hex(3)
    # Limits far above the load (the highest the model allows), so every request is counted.
    top = 1_000_000
    tenant = Tenant.objects.create(slug=slug, rate_read_per_min=top, rate_create_per_min=top, rate_other_per_min=top)
    token = tenant_services.issue_token(tenant=tenant, principal_name="bencher", scopes=["mcp:tools", "mcp:tasks"])
    headers = [
        (b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"), (b"authorization", f"Bearer {token}".encode()),
    ]
    return slug, headers


async def _prepare(app: Any, headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], str]:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}
    status, h, body = await call(app, "/mcp", json.dumps(init).encode(), headers)
    assert status == 200, body
    session = [*headers, (b"mcp-session-id", h["mcp-session-id"].encode()), (b"mcp-protocol-version", b"2025-11-25")]
    await call(app, "/mcp", b'{"jsonrpc":"2.0","method":"notifications/initialized"}', session)
    create = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
              "params": {"name": "demo_sleep", "arguments": {"ms": 1}, "task": {"ttl": 3_600_000}}}
    status, _, body = await call(app, "/mcp", json.dumps(create).encode(), session)
    assert status == 200, body
    return session, json.loads(body)["result"]["task"]["taskId"]


async def _run(app: Any, path: str, body: bytes, headers: list[tuple[bytes, bytes]], n: int, conc: int,
               *, fresh_ids: bool = False) -> float:
    """Microseconds of this process's CPU time per request with ``conc`` clients at once.

    ``fresh_ids``: give every request its own JSON-RPC id (a creation that repeats an id in
    its session is an idempotent retry, answered with the first task, not a new creation).
    """
    remaining = n
    template = json.loads(body) if fresh_ids else None

    async def client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            payload = body
            if template is not None:
                payload = json.dumps({**template, "id": f"c{remaining}-{secrets.token_hex(4)}"}).encode()
            status, _, out = await call(app, path, payload, headers)
            assert status == 200, out

    start = time.process_time()
    await asyncio.gather(*(client() for _ in range(conc)))
    return (time.process_time() - start) / n * 1e6


async def main() -> None:
    n = int(next((a for a in sys.argv[1:] if a.isdigit()), "3000"))
    profile = "--profile" in sys.argv
    _slug, headers = await asyncio.to_thread(_setup)
    from bench.peers.bare_consumer import application as bare
    from mcptasks.asgi import application

    session, task_id = await _prepare(application, headers)
    get = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"taskId": task_id}}).encode()
    await _run(application, "/mcp", get, session, 300, 4)  # warm-up: caches, prepared statements
    await _run(bare, "/", get, session, 300, 4)
    for conc in (1, CONCURRENCY):
        b = await _run(bare, "/", get, session, n, conc)
        prof = cProfile.Profile(time.process_time) if profile and conc == CONCURRENCY else None
        if prof:
            prof.enable()
        m = await _run(application, "/mcp", get, session, n, conc)
        if prof:
            prof.disable()
            prof.dump_stats("bench-inproc.prof")
        print(f"tasks/get, {conc} at once: mcptasks {m:.0f} us CPU/request, bare consumer {b:.0f} us CPU/request "
              f"(application share {m - b:.0f} us, {m / b:.1f}x the bare consumer)", flush=True)
    if "--create" in sys.argv:
        create = json.dumps({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {
            "name": "demo_sleep", "arguments": {"ms": 1}, "task": {"ttl": 60_000}}}).encode()
        for conc in (1, CONCURRENCY):
            wall = time.perf_counter()
            m = await _run(application, "/mcp", create, session, n // 3, conc, fresh_ids=True)
            wall = (time.perf_counter() - wall) / (n // 3) * 1e6
            print(f"tools/call with task, {conc} at once: {m:.0f} us CPU/request, {wall:.0f} us wall/request",
                  flush=True)


if __name__ == "__main__":
    asyncio.run(main())
