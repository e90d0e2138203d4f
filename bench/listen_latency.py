"""Issue 29 benchmark: from a status change in a worker to `notifications/tasks` on a 2026-07-28
`subscriptions/listen` held on another web process.

Two granian web processes (A, B) and one worker share PostgreSQL and Redis, as in production.
Each task is created through A (2026-07-28, tasks extension) and listened to through B. It runs
``test_status_stamps``, which sets its status message to the wall-clock time just before the
worker commits the change; a notification's latency is its arrival time at the client minus that
stamp (one machine, one clock): the commit, the channel-layer signal, B's read and rendering of
the task (the ``tasks/get`` rendering) and the SSE write. Prints p50/p99/max and the sample count.

Usage::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/listen_latency.py [TASKS] [STAMPS_PER_TASK]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.client import iter_sse  # noqa: E402
from tests.support.client2026 import TASKS_EXTENSION, VERSION, Client2026  # noqa: E402
from tests.support.servers import make_stack  # noqa: E402

CAPS = {"extensions": {TASKS_EXTENSION: {}}}


def listen(url: str, task_id: str, arrived: list[tuple[float, dict[str, Any]]], ready: threading.Event) -> None:
    """Read one listen until the task is terminal, timing each notifications/tasks as it arrives."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": {
        "notifications": {"taskIds": [task_id]},
        "_meta": {"io.modelcontextprotocol/protocolVersion": VERSION,
                  "io.modelcontextprotocol/clientCapabilities": CAPS}}}
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": VERSION, "Mcp-Method": "subscriptions/listen"}
    with httpx.stream("POST", url, json=body, headers=headers, timeout=httpx.Timeout(30, read=60)) as response:
        for event in iter_sse(response.iter_lines()):
            if isinstance(event, str) or not event.data:
                continue
            message = json.loads(event.data)
            if message.get("method") == "notifications/subscriptions/acknowledged":
                ready.set()
            elif message.get("method") == "notifications/tasks":
                arrived.append((time.time(), message["params"]))
                if message["params"]["status"] in ("completed", "failed", "cancelled"):
                    return


def main() -> None:
    tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    stamps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        sys.exit("set DATABASE_URL (PostgreSQL) and REDIS_URL")
    stack, teardown = make_stack(Path(tempfile.mkdtemp(prefix="bench-listen-")))
    latencies: list[float] = []
    try:
        a = stack.web(server="granian", embedded_worker=False)
        b = stack.web(server="granian", embedded_worker=False)
        stack.worker(concurrency=4)
        with Client2026(a.url, capabilities=CAPS) as client:
            for _ in range(tasks):
                created = client.result("tools/call", {"name": "test_status_stamps",
                                                       "arguments": {"count": stamps, "gap_ms": 30}})
                arrived: list[tuple[float, dict[str, Any]]] = []
                ready = threading.Event()
                reader = threading.Thread(target=listen, args=(b.url, created["taskId"], arrived, ready))
                reader.start()
                reader.join(timeout=90)
                # The first notification is the state at the time of listening, not a change.
                for at, params in arrived[1:]:
                    note = params.get("statusMessage")
                    if params.get("status") == "working" and isinstance(note, str):
                        try:
                            latencies.append((at - float(note)) * 1000)
                        except ValueError:
                            continue
    finally:
        for proc in stack.procs:
            proc.terminate(timeout=10)
        teardown()
    if not latencies:
        sys.exit("no stamped notifications arrived")
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))]

    print(f"status change in a worker -> notifications/tasks on a listen at another web process (granian), "
          f"{len(latencies)} notifications: p50 {pct(50):.1f} ms, p99 {pct(99):.1f} ms, max {latencies[-1]:.1f} ms")


if __name__ == "__main__":
    main()
