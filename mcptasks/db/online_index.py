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
        if not self._online(app_label, schema_editor, to_state, "add_index"):
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if not self._online(app_label, schema_editor, from_state, "remove_index"):
            super().database_backwards(app_label, schema_editor, from_state, to_state)

    def _online(self, app_label: str, schema_editor: Any, state: Any, method: str) -> bool:
        """Add or remove the index ``CONCURRENTLY`` on PostgreSQL (True); False elsewhere.

        No ``IF NOT EXISTS``: a build that failed half way leaves an INVALID index of this name,
        which the error then points the operator to (drop it, migrate again).
        """
        if schema_editor.connection.vendor != "postgresql":
            return False
        model = state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            getattr(schema_editor, method)(model, self.index, concurrently=True)
        return True
