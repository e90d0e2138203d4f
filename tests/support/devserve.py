"""``manage.py serve`` as a newcomer runs it: a real process on SQLite under a fresh ``VAR_DIR``.

The banner's lines are read from its standard output (the MCP URL and the dev token), so the
tests see exactly what the README's first command prints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.servers import REPO, free_port


def serve_env(var_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a fresh clone: no DATABASE_URL/REDIS_URL, nothing anonymous, our VAR_DIR."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "MCPTASKS_ALLOW_ANONYMOUS", "PORT") and not k.startswith("PYTEST")
    }
    env.update({"MCPTASKS_VAR_DIR": str(var_dir), "PYTHONUNBUFFERED": "1", **(extra or {})})
    return env


@dataclass
class Serve:
    """A running ``manage.py serve`` and what its banner said."""

    popen: subprocess.Popen[bytes]
    port: int
    stderr_log: Path
    lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The MCP URL the banner printed."""
        return next(line.split()[-1] for line in self.lines if line.startswith("MCP URL:"))

    @property
    def token(self) -> str:
        """The dev token the banner printed."""
        return next(line.split()[-1] for line in self.lines if line.startswith("Dev token"))

    def output(self) -> str:
        """Standard output so far, then standard error."""
        err = self.stderr_log.read_text(errors="replace") if self.stderr_log.exists() else ""
        return "\n".join(self.lines) + "\n--- stderr ---\n" + err

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def wait_for_line(self, prefix: str, timeout: float = 90) -> str:
        """The first output line starting with ``prefix`` (waiting for it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if line.startswith(prefix):
                    return line
            if self.popen.poll() is not None and (self._reader is None or not self._reader.is_alive()):
                break
            time.sleep(0.05)
        raise AssertionError(f"no line {prefix!r} from serve:\n{self.output()}")

    def wait_ready(self, timeout: float = 60) -> None:
        """Until the banner is out and ``/healthz`` answers."""
        self.wait_for_line("Dev token", timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.popen.poll() is None, self.output()
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"serve did not answer:\n{self.output()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``sig`` and wait; SIGKILL if it has not exited within ``timeout``."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        if self._reader is not None:
            self._reader.join(5)
        return self.popen.returncode


def start_serve(
    var_dir: Path, *, port: int | None = None, extra_env: dict[str, str] | None = None, args: tuple[str, ...] = (),
    port_variable: bool = False,
) -> Serve:
    """Start ``manage.py serve --port PORT`` (not waiting: see :meth:`Serve.wait_ready`).

    With ``port_variable`` the port is given as the ``PORT`` environment variable instead.
    """
    port = port or free_port()
    extra_env = {**(extra_env or {}), "PORT": str(port)} if port_variable else extra_env
    port_args = [] if port_variable else ["--port", str(port)]
    var_dir.mkdir(parents=True, exist_ok=True)
    stderr_log = var_dir / f"serve-{port}-{time.monotonic_ns()}.stderr"
    with open(stderr_log, "wb") as fh:
        popen = subprocess.Popen(
            [sys.executable, "manage.py", "serve", *port_args, *args],
            cwd=REPO, env=serve_env(var_dir, extra_env), stdout=subprocess.PIPE, stderr=fh,
        )
    serve = Serve(popen=popen, port=port, stderr_log=stderr_log)
    serve._reader = threading.Thread(target=serve._read, daemon=True)
    serve._reader.start()
    return serve
