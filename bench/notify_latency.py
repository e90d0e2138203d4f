"""Issue 13 benchmark (c): from a status change in a worker to `notifications/tasks/status` at a
client connected to another web process.

Two granian web processes (A, B) and one worker share PostgreSQL and Redis, as in production.
The client opens its session and creates tasks through A and reads its GET stream through B.
Each task runs ``test_status_stamps``, which sets its status message to the wall-clock time just
before the worker commits the change; the latency of a notification is the time it arrived at
the client minus that stamp (one machine, one clock): the commit, the channel-layer signal, B's
read of the change and the SSE write. Prints p50/p99/max and the sample count.

Usage::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/notify_latency.py [TASKS] [STAMPS_PER_TASK]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.live_support import Listener, is_terminal_note, twin  # noqa: E402
from tests.support.client import McpClient, SseEvent  # noqa: E402
from tests.support.servers import make_stack  # noqa: E402


def main() -> None:
    tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    stamps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        sys.exit("set DATABASE_URL (PostgreSQL) and REDIS_URL")
    stack, teardown = make_stack(Path(tempfile.mkdtemp(prefix="bench-notify-")))
    latencies: list[float] = []
    try:
        a = stack.web(server="granian", embedded_worker=False)
        b = stack.web(server="granian", embedded_worker=False)
        stack.worker(concurrency=4)
        with McpClient(a.url) as client:
            client.initialize()
            for _ in range(tasks):
                arrived: list[tuple[float, dict[str, object]]] = []
                listener = Listener(twin(client, b.url))
                terminal: list[object] = []

                def on_event(ev: SseEvent, _into: list[tuple[float, dict[str, object]]] = arrived,
                             _terminal: list[object] = terminal) -> bool:
                    # Called as each event arrives: its time is taken here.
                    message = ev.message
                    if message and message.get("method") == "notifications/tasks/status":
                        _into.append((time.time(), message["params"]))
                    return bool(_terminal) and _terminal[0](ev)  # type: ignore[operator]

                listener.until = on_event
                listener.start()
                listener.wait_primed()
                task = client.call_task("test_status_stamps", {"count": stamps, "gap_ms": 30})
                terminal.append(is_terminal_note(task["taskId"]))
                listener.wait_done(timeout=60)
                for at, params in arrived:
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

    print(f"status change in a worker -> notifications/tasks/status on another web process (granian), "
          f"{len(latencies)} notifications: p50 {pct(50):.1f} ms, p99 {pct(99):.1f} ms, max {latencies[-1]:.1f} ms")


if __name__ == "__main__":
    main()
