"""The worker's large hot statements, prepared on the server where that is safe.

The claim and finish statements (:mod:`mcptasks.models.claimsql`, :mod:`mcptasks.tasks.finishsql`)
are a dozen CTEs each. Through Django's cursor the parameters are bound on the client, so the
server parses and plans them on every execution (planning the finish statement cost about as
much as running it, ``bench/RESULTS.md``, issue 27), and psycopg re-parses their text for
placeholders every time (it caches that only for statements under 4 kB). :func:`fetchall` runs
such a statement, written with ``%(name)s`` placeholders, as a server-side prepared statement:
its text is numbered (``$1``...) once per process and the server plans it once per connection.

Prepared directly against PostgreSQL only: behind a transaction pooler consecutive transactions
may run on different server connections, which do not know each other's prepared statements
(and a name could reach another client's statement), so there the statement goes unnamed
(parsed and planned each time, as a client-bound one would be). On other databases and while
queries are logged (``DEBUG``, tests that capture them: a prepared execution has no SQL text to
log), it is Django's usual cursor. Either way it is Django's cursor wrapper: errors are Django's
and execute wrappers see the statement.

List parameters (the batches' arrays) are sent in PostgreSQL's binary array format. In the text
format psycopg escapes every element in Python, calling back for each quote and backslash: a
finish batch of ten outcomes, whose stream notes and results are JSON, cost about 0.55 ms of
CPU to send against 0.07 ms in binary (issue 27).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.types.array import ListBinaryDumper

from mcptasks import conf

#: psycopg's count of executions before it prepares a statement by itself: never reached.
_NEVER_BY_COUNT = 2**31 - 1

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")

#: Statement text -> (numbered text, parameter names in number order). The statements are a few
#: fixed texts built from model metadata, so this stays small.
_numbered: dict[str, tuple[str, list[str]]] = {}


def fetchall(sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Run ``sql`` (``%(name)s`` placeholders, ``%%`` for a percent sign) with ``params``; its rows."""
    from django.db import connection

    if connection.vendor != "postgresql" or connection.queries_logged:
        with connection.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())
    numbered, names = _number(sql)
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw = connection.connection
    prepare = conf.get().DB_POOLER == "none"
    if prepare and raw.prepare_threshold is None:
        # Django leaves it None, which makes psycopg prepare nothing, even when asked. Only this
        # cursor asks (Django's own cursors bind on the client and never prepare), and it asks
        # every time, so the count itself never matters.
        raw.prepare_threshold = _NEVER_BY_COUNT
    # A DB-API cursor, which make_cursor wraps (its stub says a wrapper).
    preparing: Any = _Preparing(raw, prepare=prepare)
    with connection.make_cursor(preparing) as cur:
        cur.execute(numbered, [params[name] for name in names])
        return list(cur.fetchall())


def _number(sql: str) -> tuple[str, list[str]]:
    """``sql`` with ``$n`` placeholders (one number per name), and the names in number order."""
    found = _numbered.get(sql)
    if found is None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return "%"
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        found = _numbered[sql] = (_PLACEHOLDER.sub(number, sql), names)
    return found


class _Preparing(psycopg.RawCursor):
    """A psycopg raw cursor (``$n`` placeholders, nothing parsed client-side) that prepares what it
    runs, or runs it unnamed (``prepare=False``), and sends lists as binary arrays."""

    def __init__(self, connection: psycopg.Connection[Any], *, prepare: bool = True) -> None:
        super().__init__(connection)
        self._prepare = prepare
        # Only this cursor's map: Django's own cursors bind on the client, which needs text.
        self.adapters.register_dumper(list, ListBinaryDumper)

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                binary: bool | None = None) -> Any:
        return super().execute(query, params, prepare=self._prepare if prepare is None else prepare, binary=binary)


def runs_alone() -> bool:
    """Whether one statement may run in autocommit now, its locks ending with it: directly against
    PostgreSQL (behind a transaction pooler the timeouts are set per transaction, so a statement
    needs one) and outside a caller's transaction (whose atomicity it must join)."""
    from django.db import connection

    return not connection.in_atomic_block and conf.get().DB_POOLER == "none"
