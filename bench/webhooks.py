"""Webhook delivery throughput and lag (not a test: a measurement)

Usage (PostgreSQL + Redis, like production)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/webhooks.py [--tasks 1000] [--workers 1] [--endpoints 1]

It creates a scratch database with one tenant and ``--endpoints`` webhook endpoints, all
pointing at a local receiver (an HTTP server thread of this script that verifies every
signature with the ``standardwebhooks`` package), enqueues ``--tasks`` ``test_tick`` tasks and
starts ``mcptasks_worker`` subprocesses. It prints the deliveries per second from the first
task finishing to the last event received, and the lag of each event: the time it was received
minus the time its task finished (``finished_at``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path
from tempfile import mkdtemp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--endpoints", type=int, default=1)
    parser.add_argument("--per-endpoint", default="4", help="MCPTASKS_WEBHOOK_CONCURRENCY_PER_ENDPOINT")
    opts = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        print("needs DATABASE_URL=postgres://... and REDIS_URL=redis://... (workers are separate processes)")
        return 2

    from tests.e2e.test_worker_multiprocess import sql
    from tests.support.servers import make_stack
    from tests.support.webhook_receiver import Receiver

    stack, teardown = make_stack(Path(mkdtemp(prefix="mcpt-bench-")))
    receiver = Receiver(secret="")
    arrivals: dict[str, float] = {}
    try:
        env = {"MCPTASKS_OUTBOUND_ALLOWED_NETWORKS": "127.0.0.0/8", "LOG_LEVEL": "WARNING",
               "MCPTASKS_WEBHOOK_CONCURRENCY_PER_ENDPOINT": opts.per_endpoint}
        receiver.start()
        stack.manage("mcptasks_tenant", "create", "default")
        secrets_ = []
        for _ in range(opts.endpoints):
            out = stack.manage("mcptasks_tenant", "webhook", "add", "default", receiver.url, extra_env=env)
            secrets_.append(out.stdout.strip().splitlines()[-1])
        if len(secrets_) > 1:
            # One receiver, one secret to verify with: every endpoint gets the first one's.
            sql(stack, "UPDATE tenants_webhookendpoint SET secret = (SELECT secret FROM tenants_webhookendpoint "
                       "ORDER BY id LIMIT 1)")
        receiver.secret = secrets_[0]
        stack.manage("mcptasks_enqueue", "test_tick", "--count", str(opts.tasks), "--arguments", '{"n": 1}')
        expected = opts.tasks * opts.endpoints
        started = time.monotonic()
        for _ in range(opts.workers):
            stack.worker(concurrency=16, extra_env=env)
        while True:
            with receiver.lock:
                for r in receiver.received:
                    arrivals.setdefault(r.msg_id, r.at)
            if len(arrivals) >= expected or time.monotonic() - started > 600:
                break
            time.sleep(0.05)
        rows = sql(stack, "SELECT d.msg_id, t.finished_at FROM mcptasks_webhookdelivery d "
                          "JOIN mcptasks_task t ON t.task_id = d.task_id")
        finished = {msg_id: at.timestamp() for msg_id, at in rows if isinstance(at, dt.datetime)}
        lags = sorted((arrivals[m] - finished[m]) * 1000 for m in arrivals if m in finished)
        first_end = min(finished.values())
        span = max(arrivals.values()) - first_end
        print(f"{opts.tasks} tasks, {opts.endpoints} endpoint(s), {opts.workers} worker(s): "
              f"{len(arrivals)}/{expected} events delivered, {receiver.rejected} rejected")
        print(f"throughput: {len(arrivals) / span:.0f} deliveries/s (first task end to last event, {span:.1f} s)")
        print(f"lag ms (received - task finished): p50 {statistics.median(lags):.0f}, "
              f"p95 {lags[int(0.95 * (len(lags) - 1))]:.0f}, max {lags[-1]:.0f}")
        return 0 if len(arrivals) == expected and receiver.rejected == 0 else 1
    finally:
        receiver.stop()
        teardown()


if __name__ == "__main__":
    sys.exit(main())
