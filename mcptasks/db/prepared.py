"""A Django cursor whose statements PostgreSQL prepares: for the worker's large hot statements.

The claim and finish statements (:mod:`mcptasks.models.claimsql`, :mod:`mcptasks.tasks.finishsql`)
are a dozen CTEs each. Django's cursor binds parameters on the client, so the server parses and
plans them on every execution; planning the finish statement costs about as much as running it
(``bench/RESULTS.md``, issue 27). This cursor binds on the server and asks psycopg to prepare
each statement on the connection once, then execute the prepared statement.

Directly against PostgreSQL only: behind a transaction pooler consecutive transactions may run
on different server connections, which do not know each other's prepared statements (and a
name could reach another client's statement). There, and on other databases, it is Django's
usual cursor, and so it is while queries are logged (``DEBUG``, tests that capture them). Either
way the cursor is Django's wrapper: errors are Django's and execute wrappers see the statement.
"""

from __future__ import annotations

from typing import Any

from mcptasks import conf

#: psycopg's count of executions before it prepares a statement by itself: never reached.
_NEVER_BY_COUNT = 2**31 - 1


def cursor() -> Any:
    """A cursor of the default connection (use as a context manager, like ``connection.cursor()``)."""
    from django.db import connection

    if connection.vendor != "postgresql" or conf.get().DB_POOLER != "none" or connection.queries_logged:
        # Query logging (DEBUG, tests capturing queries) records the SQL text Django's own cursor
        # shows; a prepared execution would log nothing.
        return connection.cursor()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    if connection.connection.prepare_threshold is None:
        # Django leaves it None, which makes psycopg prepare nothing, even when asked. Only this
        # cursor asks (Django's own cursors bind on the client and never prepare), and it asks
        # every time, so the threshold itself is never reached.
        connection.connection.prepare_threshold = _NEVER_BY_COUNT
    raw = _preparing_cursor(connection.connection)
    return connection.make_cursor(raw)


def _preparing_class() -> type:
    from django.db.backends.postgresql import base

    server_binding: Any = base.ServerBindingCursor

    class Preparing(server_binding):
        """Django's server-binding cursor, preparing every statement it runs."""

        def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                    binary: bool | None = None) -> Any:
            return super().execute(query, params, prepare=True if prepare is None else prepare, binary=binary)

    return Preparing


_class: type | None = None


def _preparing_cursor(raw_connection: Any) -> Any:
    global _class
    if _class is None:
        _class = _preparing_class()
    return _class(raw_connection)
