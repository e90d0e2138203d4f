"""Quick tasks/get throughput of one daphne process (PostgreSQL + Redis), for side-by-side runs.

Not the issue-13 benchmark (no wrk, no peers, no core pinning): a Python client with 8 threads
in one process, which itself costs CPU on the same machine. Usage:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/5 \\
        .venv/bin/python bench/tasks_get_quick.py [CONN_MAX_AGE] [SECONDS]

``BENCH_ERA=2026-07-28`` polls with 2026-07-28 ``tasks/get`` requests (no session, per-request
``_meta``) instead of a 2025-11-25 session's. ``BENCH_TREE=/path/to/checkout`` serves that
checkout instead of this one (same client, same machine): run it in turn with this tree to
compare a change with what it replaces in one run.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx
import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.client import McpClient  # noqa: E402
from tests.support.client2026 import TASKS_EXTENSION, Client2026  # noqa: E402
from tests.support.servers import free_port  # noqa: E402


def main() -> None:
    conn_max_age = sys.argv[1] if len(sys.argv) > 1 else "600"
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
    admin = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
    name = "bench_" + secrets.token_hex(3)
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    env = {**os.environ, "DATABASE_URL": urlunparse(urlparse(admin)._replace(path="/" + name)),
           "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/5"), "DEBUG": "1",
           "MCPTASKS_ALLOW_ANONYMOUS": "1", "MCPTASKS_CHANNEL_PREFIX": name, "MCPTASKS_CONN_MAX_AGE": conn_max_age,
           "MCPTASKS_EMBEDDED_WORKER": "1", "MCPTASKS_DEMO_TOOLS": "1", "MCPTASKS_TASK_MAX_CONCURRENT": "0"}
    tree = Path(os.environ.get("BENCH_TREE") or REPO).resolve()
    era = os.environ.get("BENCH_ERA", "2025-11-25")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=tree, env=env, check=True)
    port = free_port()
    daphne = subprocess.Popen([sys.executable, "-m", "daphne", "-p", str(port), "mcptasks.asgi:application"],
                              cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        for _ in range(200):
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz")
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        client = McpClient(url)
        client.initialize()
        task_id = client.call_task("demo_sleep", {"ms": 0})["taskId"]
        count = [0]
        stop = time.monotonic() + seconds

        def run() -> None:
            if era == "2026-07-28":
                # The same task, read by the same (anonymous) principal without a session.
                with Client2026(url, capabilities={"extensions": {TASKS_EXTENSION: {}}}) as c26:
                    while time.monotonic() < stop:
                        assert c26.send("tasks/get", {"taskId": task_id})[0] == 200
                        count[0] += 1
                return
            with McpClient(url) as c:
                c.session_id, c.protocol_version = client.session_id, client.protocol_version
                while time.monotonic() < stop:
                    assert c.request("tasks/get", {"taskId": task_id}).status == 200
                    count[0] += 1

        threads = [threading.Thread(target=run) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(f"{tree.name} {era} CONN_MAX_AGE={conn_max_age}: tasks/get {count[0] / seconds:.1f} req/s "
              "(8 client threads)")
    finally:
        daphne.kill()
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
