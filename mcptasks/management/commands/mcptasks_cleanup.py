"""``manage.py mcptasks_cleanup``: delete expired tasks, old requests, stream events and sessions."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from mcptasks.tasks import cleanup


class Command(BaseCommand):
    help = "Delete expired tasks and their messages in bounded batches."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=None)

    def handle(self, *args: Any, **opts: Any) -> None:
        counts = cleanup.cleanup_expired(batch_size=opts["batch_size"])
        self.stdout.write(
            f"deleted {counts['tasks']} expired tasks, {counts['requests']} finished requests, "
            f"{counts['events']} stream events, {counts['sessions']} sessions, "
            f"{counts['workers']} dead worker rows"
        )
