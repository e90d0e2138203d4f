"""Issue 27: the claim's backlog index is added without blocking writes on PostgreSQL."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.state import ProjectState

from mcptasks.db.online_index import AddIndexOnline
from mcptasks.models import Task


def _operation() -> AddIndexOnline:
    index = next(i for i in Task._meta.indexes if i.name == "task_backlog_idx")
    return AddIndexOnline(model_name="task", index=index)


def _sql(forwards: bool) -> list[str]:
    op = _operation()
    before = ProjectState.from_apps(apps)
    with connection.schema_editor(atomic=False, collect_sql=True) as editor:
        if forwards:
            op.database_forwards("mcptasks", editor, before, before)
        else:
            op.database_backwards("mcptasks", editor, before, before)
    return editor.collected_sql


@pytest.mark.django_db
def test_the_backlog_index_is_built_and_dropped_concurrently_on_postgresql() -> None:
    assert _operation().atomic is False
    if connection.vendor != "postgresql":
        # SQLite's schema editor cannot run inside a test's transaction: the migration made it.
        with connection.cursor() as cur:
            assert "task_backlog_idx" in connection.introspection.get_constraints(cur, "mcptasks_task")
        return
    created, dropped = " ".join(_sql(True)), " ".join(_sql(False))
    assert "CREATE INDEX CONCURRENTLY" in created and "task_backlog_idx" in created
    assert "DROP INDEX CONCURRENTLY" in dropped and "task_backlog_idx" in dropped
    with connection.cursor() as cur:
        cur.execute("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                    "WHERE c.relname = 'task_backlog_idx'")
        assert cur.fetchall() == [(True,)]
