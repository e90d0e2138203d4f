"""A migration operation that adds an index without blocking writes on PostgreSQL.

A plain ``CREATE INDEX`` holds a lock that stops every insert and update of the table until the
index is built: on a large task table that stalls every creation, claim and finish of every
tenant. ``CREATE INDEX CONCURRENTLY`` builds it while they go on; it cannot run in a
transaction, so a migration using this operation sets ``atomic = False``. Other databases (the
embedded SQLite) get the plain statement.
"""

from __future__ import annotations

from typing import Any

from django.db.migrations.operations import AddIndex


class AddIndexOnline(AddIndex):
    """:class:`~django.db.migrations.operations.AddIndex`, built ``CONCURRENTLY`` on PostgreSQL."""

    atomic = False

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            # IF NOT EXISTS-free on purpose: a build that failed half way leaves an INVALID index
            # of this name, which the error then points the operator to (drop it, migrate again).
            schema_editor.add_index(model, self.index, concurrently=True)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)
