"""ANALYZE samples 7,500 rows of the task and audit tables instead of 30,000 (PostgreSQL only).

ANALYZE reads 300 rows for each unit of the largest statistics target among a table's columns
(100 by default: 30,000 rows), and most of what is left of its cost after migration 0015 is
that sample. On a host the web processes share, each autovacuum pass over the two tables held
up the creations running beside it for as long as it took (issue 27: the creation tail at 50
clients came in those bursts). A target of 25 keeps 25 most common values and 25 histogram
buckets a column: every plan of the service starts from an index on an equality (tenant,
principal, session, status) or a range (expiry, lease) that such statistics estimate well
enough to choose that index.

Every column of the two tables except those migration 0015 leaves out gets the target 25. A
column added later starts at the server's default (100), which would bring the large sample
back: ``tests/mcptasks/models/test_unsampled_columns.py`` fails until its migration sets one.
"""

from collections.abc import Callable
from typing import Any

from django.db import migrations

#: The statistics target of the sampled columns of the task and audit tables.
TARGET = 25

TABLES = ("mcptasks_task", "mcptasks_auditevent")


def _set(target: int | None) -> Callable[[Any, Any], None]:
    """Set the statistics target of every sampled column of TABLES (None: the server's default)."""

    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return  # SQLite keeps no per-column statistics
        quote = schema_editor.quote_name
        with schema_editor.connection.cursor() as cur:
            for table in TABLES:
                # The columns sampled now (0015 set 0 on the others); -1 or NULL is the default.
                cur.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                            "AND NOT attisdropped AND COALESCE(attstattarget::int, -1) <> 0", [table])
                for (column,) in cur.fetchall():
                    schema_editor.execute(f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(column)} "
                                          f"SET STATISTICS {-1 if target is None else int(target)}")

    return run


class Migration(migrations.Migration):

    dependencies = [
        ('mcptasks', '0015_unsampled_columns'),
    ]

    operations = [
        migrations.RunPython(_set(TARGET), _set(None), elidable=False),
    ]
