"""Issue 27: the hot statements' batches reach PostgreSQL as binary arrays, prepared only directly."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from psycopg import pq
from psycopg.adapt import PyFormat

from mcptasks.db import prepared
from tests.support.requirements import require_postgres

#: What a finish batch carries: JSON with quotes and backslashes, non-ASCII text, NULLs.
AWKWARD = ['{"a":"b\\"c","d":[1,2]}', None, "", "é ✓ \\ ' {}", '{"x":null}']

ROUND_TRIP = ("SELECT %(texts)s::text[], %(ids)s::bigint[], %(counts)s::integer[], %(empty)s::text[], "
              "cardinality(%(texts)s::text[]), '100%%'")


def _prepared_count() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_prepared_statements")
        return int(cur.fetchone()[0])


@pytest.mark.django_db
def test_the_preparing_cursor_dumps_lists_in_binary() -> None:
    """In the text format psycopg escapes each element in Python (about 50 us for each JSON note of
    a finish batch); the binary format copies it."""
    require_postgres()
    connection.ensure_connection()
    cursor = prepared._Preparing(connection.connection)
    try:
        dumper = cursor.adapters.get_dumper(list, PyFormat.AUTO)
        assert dumper.format == pq.Format.BINARY
        # Django's own cursors on the same connection still bind on the client, in text.
        assert connection.connection.adapters.get_dumper(list, PyFormat.AUTO).format == pq.Format.TEXT
    finally:
        cursor.close()


@pytest.mark.parametrize("pooler", ["none", "transaction"])
@pytest.mark.django_db
def test_arrays_round_trip_and_only_a_direct_connection_prepares(settings: Any, pooler: str) -> None:
    require_postgres()
    settings.MCPTASKS = {**settings.MCPTASKS, "DB_POOLER": pooler}
    params = {"texts": AWKWARD, "ids": [2**40, 7], "counts": [70_000, 1], "empty": []}
    before = _prepared_count()
    [row] = prepared.fetchall(ROUND_TRIP, params)
    assert row == (AWKWARD, [2**40, 7], [70_000, 1], [], len(AWKWARD), "100%")
    # Behind a transaction pooler the next statement may run on another server connection: a
    # named statement would be missing there, or reach another client's.
    assert _prepared_count() - before == (1 if pooler == "none" else 0)
    # Run again: the same prepared statement (or none) serves it.
    assert prepared.fetchall(ROUND_TRIP, params) == [row]
    assert _prepared_count() - before == (1 if pooler == "none" else 0)
