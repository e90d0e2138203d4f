"""Issue 28: a host lost mid-load, at a larger size than the end-to-end tests.

Two layouts, each three "hosts" (a web process plus one worker), in the same run so their
figures compare on the same machine load:

- ``kill``: loopback process groups (daphne/granian + worker) on the stack's PostgreSQL and
  Redis; every process of the third host gets SIGKILL (tests/e2e/test_lost_host.py).
- ``netns``: the reference deployment: one network namespace per host (granian + worker),
  PgBouncer in transaction mode and a Redis primary + replica + 3 Sentinels on the bridge's
  address; the third host is frozen and its link taken down, inside a transaction when one can
  be caught: no FIN, no RST (tests/e2e/test_reference_deployment.py, tests/support/netns.py).
  Where namespaces are not allowed it runs as loopback process groups, frozen, and says so.

Clients (``--clients`` per host) create tasks through every web process; the scenario and its
exactly-once checks are tests/support/lost_host.py. Prints per layout the takeover time (loss
until the last orphaned task was rerun elsewhere or failed as "worker lost"), the error counts,
and any exactly-once violation; for ``netns`` also the transactions the lost host left open
and when each ended. Usage:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/5 \\
        .venv/bin/python bench/lost_host.py [TASKS_PER_CLIENT] [CONCURRENCY] [--layout kill,netns] [--clients 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.lost_host import HOST_ENV, Host, Outcome, hosts, run  # noqa: E402
from tests.support.netns import deployment  # noqa: E402
from tests.support.servers import Stack, make_stack  # noqa: E402


@contextmanager
def layout_hosts(stack: Stack, layout: str, concurrency: int) -> Iterator[tuple[list[Host], str]]:
    """The three hosts of ``layout`` and a description of it."""
    if layout == "kill":
        with hosts(stack, 3, concurrency=concurrency) as hs:
            yield hs, "loopback process groups, SIGKILL, stack PostgreSQL + Redis"
    else:
        with deployment(stack, 3, concurrency=concurrency) as dep:
            where = ("network namespaces, frozen + link down" if dep.layout == "netns"
                     else f"loopback process groups, frozen ({dep.fallback_reason})")
            yield list(dep.hosts), f"{where}, PgBouncer (transaction) + {dep.services.redis_layout}"


def report(layout: str, what: str, out: Outcome, wall: float, concurrency: int, clients: int) -> None:
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    print(f"== {layout}: {what}")
    print(f"   hosts 3 (web + worker, concurrency {concurrency}), {clients} client(s) per host, lease "
          f"{HOST_ENV['MCPTASKS_WORKER_LEASE_S']} s, heartbeat {HOST_ENV['MCPTASKS_WORKER_HEARTBEAT_S']} s, "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"   tasks created {out.created}, orphaned by the loss {out.orphaned}, run wall {wall:.1f} s")
    print(f"   takeover (loss -> last orphan rerun or failed as lost): {out.takeover_s:.2f} s")
    print(f"   errors seen by clients of surviving hosts: {len(out.survivor_errors)}")
    print(f"   errors seen by clients of the lost host (their server vanished): {out.lost_host_errors}")
    print(f"   exactly-once violations: {len(out.problems)}")
    detail = out.lost_detail
    if detail:
        print(f"   in a transaction at the loss (PgBouncer): {detail.get('in_transaction_at_loss')} "
              f"after {detail.get('freeze_attempts')} freeze attempt(s)")
        for tx in detail.get("open_transactions", []):
            print(f"   left open: {tx['process']} '{tx['last'][:70]}' ended after {tx['ended_after_s']:.2f} s")
        print(f"   still open at the end of the watch: {detail.get('open_transactions_at_watch_end')}")
    for line in [*out.survivor_errors, *out.problems][:20]:
        print("     ", line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("per_client", nargs="?", type=int, default=60, help="tasks per client")
    parser.add_argument("concurrency", nargs="?", type=int, default=6, help="worker concurrency")
    parser.add_argument("--layout", default="kill,netns", help="comma-separated: kill, netns")
    parser.add_argument("--clients", type=int, default=2, help="clients per host")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        print("needs DATABASE_URL=postgres://... and REDIS_URL", file=sys.stderr)
        return 2
    failed = False
    for layout in args.layout.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            stack, teardown = make_stack(Path(tmp))
            try:
                with layout_hosts(stack, layout, args.concurrency) as (hs, what):
                    started = time.monotonic()
                    out = run(stack, hs, per_host=args.per_client, gap_s=0.05, ms=(500, 2000), settle_s=90,
                              min_running=args.concurrency - 1, clients_per_host=args.clients)
                    wall = time.monotonic() - started
            finally:
                teardown()
        report(layout, what, out, wall, args.concurrency, args.clients)
        failed = failed or bool(out.problems or out.survivor_errors)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
