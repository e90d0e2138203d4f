"""Pages a PostgreSQL statement reads: how tests hold a statement to a plan that does not grow
with the table (a primary-key or index lookup, not a scan)."""

from __future__ import annotations

from django.db import connection
from django.db.models import Model


def pages_fetched(model: type[Model]) -> int:
    """Pages of ``model``'s table and its indexes this connection's open transaction has asked
    for so far (``pg_stat_get_xact_blocks_fetched``: hits and reads alike). Call it inside
    ``transaction.atomic()``, before and after the statement."""
    table = model._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            "SELECT COALESCE(SUM(pg_stat_get_xact_blocks_fetched(c.oid)), 0) FROM pg_class c "
            "WHERE c.oid = %s::regclass OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass)",
            [table, table])
        row = cur.fetchone()
    return int(row[0]) if row else 0
