"""``manage.py serve``: migrate, make sure a demo tenant exists, and serve everything in one process."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from mcptasks import conf, hardening
from mcptasks.serving import DevServer


class Command(BaseCommand):
    help = "Migrate and serve the MCP endpoint with an embedded worker (the one-command default)."
    # Checks run below, once the development-only warnings are silenced.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-worker", action="store_true", help="Do not run the embedded worker.")
        parser.add_argument("--no-migrate", action="store_true")

    def handle(self, *args: Any, **opts: Any) -> None:
        # This is the local development server: the development SECRET_KEY is expected here
        # (production runs daphne, where check mcptasks.W001 still warns).
        settings.SILENCED_SYSTEM_CHECKS = [*settings.SILENCED_SYSTEM_CHECKS, "mcptasks.W001"]
        hardening.allow_dev_secret_key()
        call_command("check")
        if not opts["no_migrate"]:
            call_command("migrate", interactive=False, verbosity=0)
        settings.MCPTASKS["EMBEDDED_WORKER"] = not opts["no_worker"]
        conf.reset()  # the dict changed in place: no setting_changed signal
        server = DevServer(host=opts["host"], port=opts["port"])
        for line in server.banner():
            self.stdout.write(line)
        self.stdout.flush()
        server.run()
