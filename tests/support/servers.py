"""Real processes for end-to-end tests: daphne servers and workers sharing one database.

With ``DATABASE_URL=postgres://...`` (and ``REDIS_URL``) each test session gets its own
PostgreSQL database and channel-layer prefix, so several daphne and worker processes can share
them. Without, one SQLite file and the in-memory layer: a single daphne with its embedded worker.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import httpx

REPO = Path(__file__).resolve().parents[2]

FAST_SETTINGS = {
    "MCPTASKS_WORKER_HEARTBEAT_S": "0.5",
    "MCPTASKS_WORKER_LEASE_S": "3",
    "MCPTASKS_WORKER_POLL_S": "0.5",
    "MCPTASKS_TASK_RESULT_RECHECK_S": "1",
    "MCPTASKS_SSE_KEEPALIVE_S": "5",
    "MCPTASKS_WORKER_SHUTDOWN_GRACE_S": "3",
}


#: The delivery settings at their defaults (FAST_SETTINGS shortens the backstops that would
#: hide a lost wake-up or a deaf stream).
DEFAULT_DELIVERY = {
    "MCPTASKS_TASK_RESULT_RECHECK_S": "5",
    "MCPTASKS_SSE_KEEPALIVE_S": "15",
    "MCPTASKS_WORKER_POLL_S": "2",
}


#: The ASGI servers the tests start, as ``python -m`` arguments for a port: uvicorn (the documented
#: production server, see docs/operations.md), daphne (Channels' reference server, ``serve``) and
#: granian. uvicorn as documented: no lifespan (Channels' router has none), no proxy headers
#: (the application's own trusted-proxy setting decides who the client is) and no access log
#: (it prints query strings, where a misplaced token would reach the log).
#: The documented production web server (docs/operations.md), as the deployment tests run it.
PRODUCTION_SERVER = "uvicorn"
#: uvicorn's ``--http`` in the documented command: one write per response (docs/operations.md).
UVICORN_PROTOCOL = "mcptasks.processes.uvicorn_http:HttpToolsProtocol"


def _uvicorn(port: int, protocol: str) -> list[str]:
    """uvicorn as documented (see above), with ``protocol`` as its ``--http``."""
    return ["-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port), "--lifespan", "off", "--no-proxy-headers",
            "--no-access-log", "--no-server-header", "--http", protocol, "mcptasks.asgi:application"]


WEB_SERVERS = {
    "daphne": lambda port: ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "mcptasks.asgi:application"],
    "granian": lambda port: [
        "-m", "granian", "--interface", "asginl", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "mcptasks.asgi:application",
    ],
    "uvicorn": lambda port: _uvicorn(port, UVICORN_PROTOCOL),
    # uvicorn's own httptools protocol (a response's head and body in two writes), for the benches
    # that compare it with the documented one.
    "uvicorn-stock": lambda port: _uvicorn(port, "httptools"),
}


@contextmanager
def web_and_worker(
    stack: Stack, *, env: dict[str, str] | None = None, concurrency: int = 8, web_env: dict[str, str] | None = None
) -> Iterator[Proc]:
    """A daphne without embedded worker plus one worker process (PostgreSQL + Redis), stopped after."""
    procs = [stack.daphne(embedded_worker=False, extra_env={**(env or {}), **(web_env or {})})]
    try:
        procs.append(stack.worker(concurrency=concurrency, extra_env=env))
        yield procs[0]
    finally:
        for p in procs:
            p.terminate(timeout=15)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """A child process with its log file."""

    popen: subprocess.Popen[bytes]
    log: Path
    url: str = ""
    base: str = ""

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to clean up (a crash)."""
        if self.alive:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def terminate(self, timeout: float = 30) -> int | None:
        """SIGTERM and wait."""
        if self.alive:
            self.popen.send_signal(signal.SIGTERM)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.popen.returncode


def wait_healthy(proc: Proc, name: str, *, within_s: float) -> Proc:
    """Wait for ``proc``'s ``/healthz`` to answer 200; raise with its log if it exits or never does."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not proc.alive:
            raise RuntimeError(f"{name} exited:\n{proc.log_text()}")
        try:
            if httpx.get(f"{proc.base}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not start:\n{proc.log_text()}")


@dataclass
class Stack:
    """One database (+ channel prefix) that any number of processes share."""

    env: dict[str, str]
    backend: str  # "postgres" | "sqlite"
    has_redis: bool
    tmp: Path
    procs: list[Proc] = field(default_factory=list)

    @property
    def multi_process(self) -> bool:
        """Whether several processes can cooperate (needs PostgreSQL and Redis)."""
        return self.backend == "postgres" and self.has_redis

    def _spawn(self, args: list[str], name: str, extra_env: dict[str, str] | None = None) -> Proc:
        log = self.tmp / f"{name}-{secrets.token_hex(3)}.log"
        env = {**os.environ, **self.env, **(extra_env or {})}
        with open(log, "wb") as fh:  # the child keeps its own copy of the descriptor
            popen = subprocess.Popen(args, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
        proc = Proc(popen, log)
        self.procs.append(proc)
        return proc

    def manage(self, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.env, **(extra_env or {})}
        return subprocess.run(
            [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
            check=True,
        )

    def daphne(self, *, embedded_worker: bool | None = None, extra_env: dict[str, str] | None = None) -> Proc:
        """Start a daphne process and wait until it answers."""
        return self.web(server="daphne", embedded_worker=embedded_worker, extra_env=extra_env)

    def web(
        self, *, server: str, embedded_worker: bool | None = None, extra_env: dict[str, str] | None = None
    ) -> Proc:
        """Start a web process under ``server`` (one of :data:`WEB_SERVERS`) and wait until it answers."""
        port = free_port()
        if embedded_worker is None:
            embedded_worker = not self.multi_process
        env = {"MCPTASKS_EMBEDDED_WORKER": "1" if embedded_worker else "0", **(extra_env or {})}
        proc = self._spawn([sys.executable, *WEB_SERVERS[server](port)], f"{server}-{port}", env)
        proc.base = f"http://127.0.0.1:{port}"
        proc.url = f"{proc.base}/mcp"
        return wait_healthy(proc, server, within_s=40)

    def worker(self, *, concurrency: int = 4, extra_env: dict[str, str] | None = None) -> Proc:
        """Start an ``mcptasks_worker`` process and wait for it to run."""
        proc = self._spawn(
            [sys.executable, "manage.py", "mcptasks_worker", "--concurrency", str(concurrency)], "worker", extra_env
        )
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            if "running (concurrency" in proc.log_text():
                return proc
            if not proc.alive:
                raise RuntimeError(f"worker exited:\n{proc.log_text()}")
            time.sleep(0.1)
        raise RuntimeError(f"worker did not start:\n{proc.log_text()}")

    def token(self, tenant: str = "acme", principal: str = "alice", scopes: str = "mcp:tools mcp:tasks") -> str:
        """A bearer token from the built-in authorization server (last line of the command)."""
        self.manage("mcptasks_tenant", "create", tenant)
        out = self.manage("mcptasks_tenant", "token", tenant, "--principal", principal, "--scopes", *scopes.split())
        return out.stdout.strip().splitlines()[-1]

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.alive:
                proc.terminate(timeout=10)
        self.procs.clear()


def make_stack(tmp: Path) -> tuple[Stack, Any]:
    """Create the shared database; returns the stack and a teardown callable."""
    database_url = os.environ.get("DATABASE_URL", "")
    redis_url = os.environ.get("REDIS_URL", "")
    env = {
        "SECRET_KEY": "e2e-" + secrets.token_hex(16),
        "DEBUG": "1",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "MCPTASKS_ALLOW_ANONYMOUS": "1",
        "MCPTASKS_CONFORMANCE_FIXTURES": "1",
        # Off by default; the end-to-end tests and the conformance runs call them.
        "MCPTASKS_DEMO_TOOLS": "1",
        # Every module of a session shares the stack's tenants (the anonymous default one above
        # all), and tasks left live by one test would count against the next one's default
        # quota: tests of quotas set a tenant's own limit (tests/security/test_default_quotas.py
        # covers the default).
        "MCPTASKS_TASK_MAX_CONCURRENT": "0",
        "MCPTASKS_EXTRA_APPS": "mcptasks.testing",
        "MCPTASKS_CHANNEL_PREFIX": "e2e" + secrets.token_hex(4),
        "MCPTASKS_VAR_DIR": str(tmp),
        "LOG_LEVEL": "INFO",
        # One stack serves a whole test session, and most modules share its anonymous principal:
        # far more sessions and streams than one principal may hold in production. The tests of
        # those caps set their own (tests/security/test_session_limits.py).
        "MCPTASKS_MAX_SESSIONS_PER_PRINCIPAL": "0",
        "MCPTASKS_MAX_STREAMS_PER_PRINCIPAL": "0",
        **FAST_SETTINGS,
    }
    drop: Any = None
    if database_url.startswith(("postgres://", "postgresql://")):
        import psycopg

        name = "mcpt_e2e_" + secrets.token_hex(4)
        parts = urlparse(database_url)
        admin_dsn = database_url
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        env["DATABASE_URL"] = urlunparse(parts._replace(path="/" + name))

        def drop() -> None:
            with psycopg.connect(admin_dsn, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        backend = "postgres"
    else:
        env["DATABASE_URL"] = f"sqlite:///{tmp / 'e2e.sqlite3'}"
        backend = "sqlite"
    if redis_url:
        env["REDIS_URL"] = redis_url
    else:
        env.pop("REDIS_URL", None)
    stack = Stack(env=env, backend=backend, has_redis=bool(redis_url), tmp=tmp)
    stack.manage("migrate", "--noinput")

    def teardown() -> None:
        stack.stop_all()
        if drop is not None:
            drop()

    return stack, teardown


def descendants(pids: list[int]) -> list[int]:
    """``pids`` and every process below them (granian's worker processes), from /proc."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parent[int(stat.parent.name)] = int(fields[1])
    found = list(pids)
    for pid in found:  # grows while iterating: breadth-first
        found.extend(child for child, ppid in parent.items() if ppid == pid and child not in found)
    return found
