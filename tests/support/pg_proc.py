"""A private PostgreSQL server for fault tests (never the shared one): start, restart, stop."""

from __future__ import annotations

import glob
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.servers import free_port


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


class PrivatePostgres:
    """initdb + pg_ctl in a temporary directory, run as the ``postgres`` OS user when root."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="mcpt-pg-"))
        self.data = self.dir / "data"
        self.initdb, self.pg_ctl = _bin("initdb"), _bin("pg_ctl")

    @property
    def available(self) -> bool:
        return bool(self.initdb and self.pg_ctl)

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if shutil.which("runuser") and _is_root() else []
        return subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120, check=True)

    def start(self) -> None:
        """Create the cluster (first time) and start it; wait until it accepts connections."""
        if not self.data.exists():
            if _is_root():
                subprocess.run(["chown", "postgres", str(self.dir)], check=True)
            assert self.initdb is not None
            self._run(self.initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres")
        assert self.pg_ctl is not None
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.dir / "log"), "-w",
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start")

    def restart_immediate(self) -> None:
        """``pg_ctl restart -m immediate``: every connection is cut, no clean shutdown."""
        assert self.pg_ctl is not None
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-m", "immediate",
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "restart")

    def stop(self) -> None:
        """Stop it and remove its files."""
        if self.pg_ctl and self.data.exists():
            try:
                self._run(self.pg_ctl, "-D", str(self.data), "-m", "immediate", "stop")
            except subprocess.CalledProcessError:
                pass
        time.sleep(0.2)
        shutil.rmtree(self.dir, ignore_errors=True)


def _is_root() -> bool:
    import os

    return os.geteuid() == 0
