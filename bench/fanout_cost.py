"""Issue 27: what one task costs on the write path, counted rather than timed under load.

On a machine shared with other work, end-to-end figures (``bench/e2e_load.py``) swing by 2x between
rounds. This script measures, in one process on a scratch PostgreSQL database with the Redis
channel layer:

- **finish fan-out**: ``transitions.finish_runs`` on batches of ``--batch`` tasks (each with its own
  session, as 60 pollers have), with the batched fan-out (``fanout.after_changes``) and, interleaved in
  the same run, with the per-task one (``fanout.after_change`` per task, the code before issue 27):
  statements, channel-layer sends, wall time, this process's CPU and the PostgreSQL backend's
  CPU per task;
- **creation**: ``creation.create_task`` for a tenant without limits and one with limits:
  statements, wall time and CPU (process + backend) per creation. Run the script in an older
  checkout (``cd OLD && python /path/to/fanout_cost.py``) for its figures.

Usage: ``DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python bench/fanout_cost.py
[--batch 16] [--rounds 20]``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

REPO = Path.cwd()
sys.path.insert(0, str(REPO))
os.environ.setdefault("SECRET_KEY", "bench-" + secrets.token_hex(16))
os.environ.setdefault("DEBUG", "0")
os.environ.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost")
os.environ.setdefault("MCPTASKS_EMBEDDED_WORKER", "0")
os.environ.setdefault("MCPTASKS_DEMO_TOOLS", "1")
os.environ.setdefault("MCPTASKS_TASK_MAX_CONCURRENT", "0")
os.environ.setdefault("MCPTASKS_CHANNEL_PREFIX", "fanout" + secrets.token_hex(3))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mcptasks.settings")
TICK = os.sysconf("SC_CLK_TCK")


def _backend_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Meter:
    """Wall time, this process's CPU, the backend's CPU, statements and layer sends of a block."""

    def __init__(self, backend_pid: int, sends: list[int]) -> None:
        self.backend_pid, self.sends = backend_pid, sends

    def __enter__(self) -> Meter:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        self.q = CaptureQueriesContext(connection)
        self.q.__enter__()
        self.s0, self.w0, self.c0 = self.sends[0], time.perf_counter(), time.process_time()
        self.b0 = _backend_cpu_s(self.backend_pid)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall = time.perf_counter() - self.w0
        self.cpu = time.process_time() - self.c0
        self.backend = _backend_cpu_s(self.backend_pid) - self.b0
        self.q.__exit__(*exc)
        self.queries = len(self.q.captured_queries)
        self.nsends = self.sends[0] - self.s0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    import psycopg

    admin = os.environ["DATABASE_URL"]
    name = "fanout_" + secrets.token_hex(4)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = urlunparse(urlparse(admin)._replace(path="/" + name))
    try:
        run(args)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(args: argparse.Namespace) -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    # The production settings: DEBUG off, but count statements anyway.
    from django.db import connection

    from mcptasks.models import Outcome, Task
    from mcptasks.streams import signals
    from mcptasks.tasks import creation, fanout, transitions
    from tests.support.factories import demo_tool, make_auth, make_session, make_tenant

    connection.force_debug_cursor = True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend_pid = int(cursor.fetchone()[0])
    sends = [0]
    real_send = signals.group_send

    async def counting_send(group: str, message: dict[str, Any]) -> bool:
        sends[0] += 1
        return await real_send(group, message)

    signals.group_send = counting_send  # type: ignore[assignment]
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"fanout_cost: batches of {args.batch}, {args.rounds} rounds each way (interleaved); load {load}")

    tool = demo_tool()
    seq = iter(range(10**9))

    def create(auth: Any, session: Any) -> Task:
        return creation.create_task(auth=auth, session=session, tool=tool, arguments={"ms": 1},
                                   request_id=next(seq), progress_token=None, requested_ttl_ms=None)

    # --- creation -------------------------------------------------------------------------
    for label, limits in (("no limits", {}), ("limits 10^4", {"max_concurrent_tasks": 10**4,
                                                             "max_concurrent_tasks_per_principal": 10**4})):
        auth = make_auth(make_tenant(**limits))
        session = make_session(auth)
        for _ in range(20):
            create(auth, session)  # warm
        rows = []
        for _ in range(args.rounds * 5):
            with Meter(backend_pid, sends) as m:
                create(auth, session)
            rows.append(m)
        print(f"  create_task ({label}): {rows[0].queries} statements; per creation wall "
              f"{statistics.median(r.wall for r in rows) * 1000:.2f} ms (median), CPU "
              f"{sum(r.cpu for r in rows) / len(rows) * 1000:.2f} ms here + "
              f"{sum(r.backend for r in rows) / len(rows) * 1000:.2f} ms PostgreSQL")

    # --- finish fan-out -------------------------------------------------------------------
    auth = make_auth(make_tenant())
    sessions = [make_session(auth) for _ in range(args.batch)]
    batched = getattr(fanout, "after_changes", None)

    def per_task(tasks: list[Task]) -> None:
        for t in tasks:
            fanout.after_change(t)

    modes = {"per task": per_task}
    if batched is not None:
        modes["batched"] = batched
    results: dict[str, list[Meter]] = {m: [] for m in modes}
    for i in range(args.rounds + 2):
        for mode, spread in modes.items():
            tasks = [create(auth, s) for s in sessions]
            Task.objects.filter(pk__in=[t.pk for t in tasks]).update(attempt=1)
            runs = [(t, Outcome(pk=t.pk, attempt=1, status="completed", result={"content": []})) for t in tasks]
            if batched is not None:
                fanout.after_changes = spread  # type: ignore[attr-defined]
            with Meter(backend_pid, sends) as m:
                assert transitions.finish_runs(runs=runs) == [True] * len(runs)
            if i >= 2:  # two warm-up rounds
                results[mode].append(m)
    if batched is not None:
        fanout.after_changes = batched  # type: ignore[attr-defined]
    n = args.batch
    for mode, rows in results.items():
        print(f"  finish_runs of {n}, fan-out {mode}: {rows[0].queries} statements, {rows[0].nsends} layer sends; "
              f"per task wall {statistics.median(r.wall for r in rows) / n * 1000:.2f} ms (median), CPU "
              f"{sum(r.cpu for r in rows) / len(rows) / n * 1000:.2f} ms here + "
              f"{sum(r.backend for r in rows) / len(rows) / n * 1000:.2f} ms PostgreSQL")


if __name__ == "__main__":
    main()
