"""``manage.py serve``: migrate, make sure a demo tenant exists, and serve everything in one process."""

from __future__ import annotations

import errno
import os
import socket
import sys
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from mcptasks import conf, hardening
from mcptasks.processes.devserver import DevServer


class Command(BaseCommand):
    help = "Migrate and serve the MCP endpoint with an embedded worker (the one-command default)."
    # Checks run below, once the development-only warnings are silenced.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=None,
                            help="Port to listen on (default: the PORT environment variable, else 8000).")
        parser.add_argument("--no-worker", action="store_true", help="Do not run the embedded worker.")
        parser.add_argument("--no-migrate", action="store_true")

    def handle(self, *args: Any, **opts: Any) -> None:
        port = opts["port"] if opts["port"] is not None else _port_from_environment()
        # Fail first, clearly: a busy port is refused before anything that looks like a server.
        _check_can_listen(opts["host"], port)
        # This is the local development server: the development SECRET_KEY is expected here
        # (production runs daphne, where check mcptasks.W001 still warns).
        # The demo tools are on here too (manage.py turns them on for `serve`): W005 is expected.
        settings.SILENCED_SYSTEM_CHECKS = [*settings.SILENCED_SYSTEM_CHECKS, "mcptasks.W001", "mcptasks.W006"]
        hardening.allow_dev_secret_key()
        # It serves plain HTTP: Secure cookies would never come back, so signing in would fail.
        settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = False
        settings.SECURE_HSTS_SECONDS = 0
        settings.SECURE_SSL_REDIRECT = False
        call_command("check")
        if not opts["no_migrate"]:
            call_command("migrate", interactive=False, verbosity=0)
        settings.MCPTASKS["EMBEDDED_WORKER"] = not opts["no_worker"]
        # Development serves the published 2026-07-28 clients as they are (mcp 2.x under FastMCP 4
        # sends no Mcp-Name on tasks/*), unless the environment decides either way.
        lenient = settings.MCPTASKS.setdefault("ERA2026_TASKS_NAME_OPTIONAL", True)
        conf.reset()  # the dict changed in place: no setting_changed signal
        server = DevServer(host=opts["host"], port=port)
        for line in server.banner():
            self.stdout.write(line)
        if lenient:
            self.stdout.write("2026-07-28 clients: tasks/get|update|cancel accepted without Mcp-Name (as FastMCP 4 "
                              "sends them; MCPTASKS_ERA2026_TASKS_NAME_OPTIONAL=0 refuses them, like production)")
        self.stdout.flush()
        from mcptasks.asgi import application

        # The shutdown (drain, hand-back) is reported on serve's own output.
        application.announce = self._announce
        server.run()
        worker = application.worker
        tool_threads = getattr(getattr(worker, "tool_executor", None), "_threads", ()) if worker else ()
        if worker is not None and (worker.abandoned_threads or any(t.is_alive() for t in list(tool_threads))):
            # A handed-back sync tool still runs in a thread nothing can interrupt, and its task
            # already belongs to the next worker: exit now (like mcptasks_worker) instead of
            # waiting for the tool, which would keep this process alive past its grace period.
            self._announce("serve: exiting with a handed-back sync tool still running")
            sys.stderr.flush()
            os._exit(0)

    def _announce(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()


def _port_from_environment() -> int:
    raw = os.environ.get("PORT", "").strip()
    if not raw:
        return 8000
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise CommandError(f"PORT must be a port number, not {raw[:20]!r}")
    return int(raw)


def _check_can_listen(host: str, port: int) -> None:
    """Raise a clear CommandError when ``host:port`` cannot be listened on (bound the way daphne does)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Twisted does: TIME_WAIT is fine
            probe.bind((host.strip("[]"), port))
            probe.listen()
    except OSError as exc:
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        reason = "the port is already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise CommandError(
            f"Cannot listen on {shown}: {reason}. Stop what uses it, or pick another port with "
            "--port N (or PORT=N)."
        ) from None
