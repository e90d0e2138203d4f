"""mcptasks.W007: PostgreSQL that will not vacuum and analyze the task tables is warned about."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from mcptasks import checks
from tests.support.requirements import require_postgres

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _postgres() -> None:
    require_postgres()


def _server_autovacuum() -> str:
    with connection.cursor() as cur:
        cur.execute("SHOW autovacuum")
        return str(cur.fetchone()[0])


@pytest.fixture
def task_table_without_autovacuum() -> Iterator[None]:
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE mcptasks_task SET (autovacuum_enabled = false)")
    yield
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE mcptasks_task RESET (autovacuum_enabled)")


def test_the_server_setting_is_reported() -> None:
    expected = "PostgreSQL runs with autovacuum = off" if _server_autovacuum() == "off" else None
    assert checks.autovacuum_problem() == expected
    ids = [w.id for w in checks.check_autovacuum(None, databases=["default"])]
    assert ids == (["mcptasks.W007"] if expected else [])


@pytest.mark.usefixtures("task_table_without_autovacuum")
def test_a_task_table_with_autovacuum_disabled_is_named() -> None:
    assert checks.autovacuum_problem() == "autovacuum is disabled on mcptasks_task"
    [warning] = checks.check_autovacuum(None, databases=["default"])
    assert warning.id == "mcptasks.W007" and "mcptasks_task" in warning.msg and "docs/operations.md" in warning.hint


def test_no_database_asked_no_warning() -> None:
    """Plain ``manage.py check`` (no ``--database``) does not query the database."""
    assert checks.check_autovacuum(None, databases=None) == []


@pytest.mark.usefixtures("task_table_without_autovacuum")
def test_the_worker_logs_the_warning_when_it_starts(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    from django.core.management import call_command

    from mcptasks.management.commands import mcptasks_worker

    class _Idle:
        worker_id, concurrency, abandoned_threads = "w-test", 1, False

        def __init__(self, **_kwargs: object) -> None:
            pass

        async def run(self, stop: object) -> None:
            return None

    monkeypatch.setattr(mcptasks_worker, "Worker", _Idle)
    call_command("mcptasks_worker")
    assert "autovacuum is disabled on mcptasks_task" in caplog.text and "mcptasks.W007" in caplog.text
