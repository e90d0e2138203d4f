"""``manage.py mcptasks_enqueue TOOL --count N``: bulk-create tasks (tests and benchmarks)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from mcptasks.testing.enqueue import enqueue


class Command(BaseCommand):
    help = "Create COUNT tasks of TOOL for the default tenant's anonymous principal (bulk insert)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tool")
        parser.add_argument("--count", type=int, default=1)
        parser.add_argument("--arguments", default="{}", help="JSON arguments; {i} in string values becomes the index.")
        parser.add_argument("--batch-size", type=int, default=1000)

    def handle(self, *args: Any, **opts: Any) -> None:
        template = json.loads(opts["arguments"])

        def fill(i: int) -> dict[str, Any]:
            return {k: (v.replace("{i}", str(i)) if isinstance(v, str) else v) for k, v in template.items()}

        ids = enqueue(tool_name=opts["tool"], arguments=[fill(i) for i in range(opts["count"])],
                      batch_size=opts["batch_size"])
        self.stdout.write(f"enqueued {len(ids)} tasks of {opts['tool']}")
