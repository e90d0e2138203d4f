"""Django's PostgreSQL backend, with the timeouts set at the start of every transaction.

Selected by ``settings.py`` when ``MCPTASKS_DB_POOLER=transaction``. A transaction pooler
refuses startup options and shares server connections between clients, so the timeouts of
:mod:`mcptasks.db.config` cannot be connection settings: when Django opens a transaction
(``atomic()`` turns autocommit off) its first statement sets them with ``SET LOCAL`` semantics,
on whichever server connection the pooler chose for this transaction, and they end with it.
``BEGIN`` and that statement are sent as one message, so that no moment of the transaction is
unbounded on the server.
"""

from __future__ import annotations

import psycopg
from django.db.backends.postgresql.base import DatabaseWrapper as PostgresDatabaseWrapper


class DatabaseWrapper(PostgresDatabaseWrapper):
    """The PostgreSQL backend; every transaction starts with its timeouts set locally."""

    def _set_autocommit(self, autocommit: bool) -> None:
        conn = self.connection
        one_flight = (
            not autocommit
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            and conn.isolation_level is None
            and hasattr(conn, "_autocommit")
        )
        if not one_flight:
            super()._set_autocommit(autocommit)  # type: ignore[misc]  # not in django-stubs
        if autocommit:
            return
        from mcptasks import conf
        from mcptasks.db import config as dbconfig

        sql = dbconfig.transaction_settings_sql(conf.get())
        with self.wrap_database_errors:
            if one_flight:
                # BEGIN and the bounds in one message (the simple query protocol, no
                # parameters). Left to the driver, BEGIN goes alone and the bounds follow its
                # answer: a client lost in that round trip leaves a transaction with no bounds
                # at all, idle, with a pooler's server connection, until keepalives give up.
                # The driver refuses its public autocommit switch inside a transaction, which
                # this one already is; its own flag is what it checks before sending BEGIN.
                conn.execute(f"BEGIN; {sql}")
                conn._autocommit = False
            else:
                # Autocommit off: this statement opens (driver's BEGIN) the transaction it configures.
                conn.execute(sql)
