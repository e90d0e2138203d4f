"""Columns no plan needs statistics for are left out of ANALYZE (PostgreSQL only).

ANALYZE samples up to 30,000 rows of a table and, for every column, sorts the sample and counts
its common values. For the task and audit tables much of that work went into JSON payloads, hashes
and identifiers that no plan needs statistics for. Skipping them took an ANALYZE of about 62,000 tasks
from 0.21 to 0.12 s of one core and one of about 100,000 audit events from 0.17 to 0.09 s (issue 27:
autovacuum analyzes both tables after every tenth of their size in changes, and on a host the
web processes share, each pass showed in the creation tail). A statistics target of 0 skips the
column; the planner then uses its default estimates for it, which no query here depends on:
``task_id`` is unique by its own index, and the others appear in a WHERE clause only beside
indexed columns that pick the rows (a session's, a principal's).
"""

from collections.abc import Callable
from typing import Any

from django.db import migrations

#: table -> the columns ANALYZE skips.
UNSAMPLED = {
    "mcptasks_task": ("task_id", "status_message", "params", "request_id", "progress_token", "result", "error",
                      "progress", "idempotency_key", "traceparent"),
    "mcptasks_auditevent": ("data", "prev_hash", "hash"),
}


def _set(target: int) -> Callable[[Any, Any], None]:
    """Set the statistics target of every column of UNSAMPLED (-1: the server's default)."""

    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return  # SQLite keeps no per-column statistics
        quote = schema_editor.quote_name
        for table, columns in UNSAMPLED.items():
            for column in columns:
                schema_editor.execute(
                    f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(column)} SET STATISTICS {int(target)}")
    return run


class Migration(migrations.Migration):

    dependencies = [
        ('mcptasks', '0014_worker_wants_wakeups'),
    ]

    operations = [
        migrations.RunPython(_set(0), _set(-1), elidable=False),
    ]
