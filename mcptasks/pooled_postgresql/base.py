"""Django's PostgreSQL backend, with the timeouts set at the start of every transaction.

Selected by ``settings.py`` when ``MCPTASKS_DB_POOLER=transaction``. A transaction pooler
refuses startup options and shares server connections between clients, so the timeouts of
:mod:`mcptasks.dbconfig` cannot be connection settings: when Django opens a transaction
(``atomic()`` turns autocommit off) its first statement sets them with ``SET LOCAL`` semantics,
on whichever server connection the pooler chose for this transaction, and they end with it.
"""

from __future__ import annotations

from django.db.backends.postgresql.base import DatabaseWrapper as PostgresDatabaseWrapper


class DatabaseWrapper(PostgresDatabaseWrapper):
    """The PostgreSQL backend; every transaction starts with its timeouts set locally."""

    def _set_autocommit(self, autocommit: bool) -> None:
        super()._set_autocommit(autocommit)  # type: ignore[misc]  # not in django-stubs
        if not autocommit:
            from mcptasks import conf, dbconfig

            with self.wrap_database_errors:
                # Autocommit off: this statement opens the transaction it configures.
                self.connection.execute(dbconfig.transaction_settings_sql(conf.get()))
