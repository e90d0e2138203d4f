"""How long does a new task take to reach an idle worker? (not a test: a measurement)

Usage (PostgreSQL + Redis, like production)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/wakeup_latency.py [--samples 50] [--workers 1]

It creates a scratch database, starts ``mcptasks_worker`` subprocesses with a 5 s poll interval
(so polling cannot explain a fast start), lets them go idle, then repeatedly creates one
``test_stamp`` task in this process. The tool returns the wall-clock time it started; the
latency is that minus the time the insert committed, i.e. the channel-layer wake-up + the
claim transaction + scheduling the tool. Prints min/median/p95/max.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from tempfile import mkdtemp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--poll-s", default="5", help="Backstop poll interval of the workers.")
    opts = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        print("needs DATABASE_URL=postgres://... and REDIS_URL=redis://... (workers are separate processes)")
        return 2

    from tests.support.servers import make_stack

    stack, teardown = make_stack(Path(mkdtemp(prefix="mcpt-bench-")))
    try:
        env = {"MCPTASKS_WORKER_POLL_S": opts.poll_s, "LOG_LEVEL": "WARNING"}
        workers = [stack.worker(concurrency=4, extra_env=env) for _ in range(opts.workers)]
        os.environ.update(stack.env)
        os.environ["DJANGO_SETTINGS_MODULE"] = "mcptasks.settings"
        import django

        django.setup()
        from mcptasks.models import Task
        from mcptasks.testing.enqueue import enqueue

        time.sleep(1.0)  # let the workers finish their start-up claim and go idle
        latencies: list[float] = []
        stamps: list[float] = []
        for _ in range(opts.samples):
            (task_id,) = enqueue(tool_name="test_stamp", arguments=[{}], committed=lambda: stamps.append(time.time()))
            before = stamps[-1]
            deadline = time.monotonic() + 10
            result = None
            while time.monotonic() < deadline:
                done = Task.objects.filter(task_id=task_id, status="completed")
                result = done.values_list("result", flat=True).first()
                if result:
                    break
                time.sleep(0.002)
            if not result:
                print(f"task {task_id} did not complete within 10 s")
                return 1
            started = float(json.loads(result["content"][0]["text"])["t"])
            latencies.append((started - before) * 1000)
            time.sleep(random.uniform(0.05, 0.15))  # the worker is idle again before the next task
        latencies.sort()
        p95 = latencies[max(0, int(len(latencies) * 0.95) - 1)]
        print(f"wake-up latency over {len(latencies)} tasks, {opts.workers} idle worker(s), poll {opts.poll_s}s: "
              f"min {latencies[0]:.1f} ms, median {statistics.median(latencies):.1f} ms, "
              f"p95 {p95:.1f} ms, max {latencies[-1]:.1f} ms")
        for w in workers:
            w.terminate(timeout=20)
        return 0
    finally:
        from django.db import connections

        connections.close_all()
        teardown()


if __name__ == "__main__":
    raise SystemExit(main())
