"""Issue 28: a host lost mid-load, at a larger size than tests/e2e/test_lost_host.py.

Three loopback "hosts" (a web process, daphne or granian, plus one worker each) on one
PostgreSQL database and one Redis; clients create tasks through all three, then every process
of the third host gets SIGKILL mid-load (the scenario and its checks: tests/support/lost_host.py).
Prints the takeover time (kill until the last orphaned task was rerun elsewhere or failed as
"worker lost"), the error counts, and any exactly-once violation. Usage:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/5 \\
        .venv/bin/python bench/lost_host.py [TASKS_PER_HOST] [CONCURRENCY]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.lost_host import HOST_ENV, hosts, run  # noqa: E402
from tests.support.servers import make_stack  # noqa: E402


def main() -> int:
    per_host = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        print("needs DATABASE_URL=postgres://... and REDIS_URL", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        stack, teardown = make_stack(Path(tmp))
        try:
            with hosts(stack, 3, concurrency=concurrency) as hs:
                started = time.monotonic()
                out = run(stack, hs, per_host=per_host, gap_s=0.05, ms=(500, 2000), settle_s=90,
                          min_running=concurrency - 1)
                wall = time.monotonic() - started
        finally:
            teardown()
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(f"hosts 3 (web + worker, concurrency {concurrency}), lease {HOST_ENV['MCPTASKS_WORKER_LEASE_S']} s, "
          f"heartbeat {HOST_ENV['MCPTASKS_WORKER_HEARTBEAT_S']} s, load average {load:.1f}")
    print(f"tasks created {out.created}, orphaned by the kill {out.orphaned}, run wall {wall:.1f} s")
    print(f"takeover (kill -> last orphan rerun or failed as lost): {out.takeover_s:.2f} s")
    print(f"errors seen by clients of surviving hosts: {len(out.survivor_errors)}")
    print(f"errors seen by clients of the lost host (expected: their server died): {out.lost_host_errors}")
    print(f"exactly-once violations: {len(out.problems)}")
    for line in [*out.survivor_errors, *out.problems][:20]:
        print("  ", line)
    return 0 if not out.problems and not out.survivor_errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
