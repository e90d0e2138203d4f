"""A private PgBouncer in transaction mode in front of the test PostgreSQL (never a shared one).

Started from a generated ini on a free port: ``pool_mode = transaction``, ``auth_type = trust``,
every database forwarded to the PostgreSQL of ``DATABASE_URL`` (127.0.0.1:5432 in CI), with a
small server pool so that clients share server connections, as they do in production. Run as
the ``postgres`` OS user when root (PgBouncer refuses to run as root).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

from tests.support.requirements import skip_or_fail
from tests.support.servers import free_port


def pgbouncer_binary() -> str | None:
    """The ``pgbouncer`` executable (Debian installs it in /usr/sbin)."""
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )


class PrivatePgBouncer:
    """``pgbouncer`` on a free port, transaction pooling, in front of ``upstream_url``'s server."""

    def __init__(self, upstream_url: str, *, pool_size: int = 4, listen_addr: str = "127.0.0.1",
                 idle_transaction_timeout_s: int = 0) -> None:
        self.upstream = urlparse(upstream_url)
        # Another address than loopback (a bridge's, for hosts in network namespaces) is what
        # the processes connect to; the upstream PostgreSQL stays on its own address.
        self.listen_addr = listen_addr
        # PgBouncer's own bound on a client idle inside a transaction (0: none, PgBouncer's default).
        self.idle_transaction_timeout_s = idle_transaction_timeout_s
        self.port = free_port()
        self.pool_size = pool_size
        self.dir = Path(tempfile.mkdtemp(prefix="mcpt-pgb-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def url_for(self, database_url: str) -> str:
        """``database_url`` (same server as the upstream) through this PgBouncer."""
        parts = urlparse(database_url)
        user = parts.username or "postgres"
        return urlunparse(parts._replace(netloc=f"{user}@{self.listen_addr}:{self.port}"))

    def admin_dsn(self) -> str:
        """The admin console (``SHOW CLIENTS``…; simple query protocol only: use a ``ClientCursor``)."""
        return f"postgresql://postgres@{self.listen_addr}:{self.port}/pgbouncer"

    @property
    def log(self) -> str:
        """PgBouncer's log so far."""
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> None:
        """Write the ini and start PgBouncer; wait until it accepts connections."""
        binary = pgbouncer_binary()
        if binary is None:
            skip_or_fail("needs PgBouncer: apt-get install pgbouncer (.ci/run installs it)")
            return
        host = self.upstream.hostname or "127.0.0.1"
        port = self.upstream.port or 5432
        (self.dir / "userlist.txt").write_text('"postgres" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            f"listen_addr = {self.listen_addr}\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.dir}\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 500\n"
            "server_reset_query =\n"
            f"idle_transaction_timeout = {self.idle_transaction_timeout_s}\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n"
            "admin_users = postgres\n"
        )
        as_user: str | None = None
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "postgres", str(self.dir)], check=True)
            as_user = "postgres"
        # Started directly (not through runuser), so that terminate() signals PgBouncer itself.
        self.proc = subprocess.Popen(
            [binary, str(ini)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, user=as_user, group=as_user
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited:\n{self.log}")
            try:
                with socket.create_connection((self.listen_addr, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not start:\n{self.log}")

    def stop(self) -> None:
        """Stop it and remove its files."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
