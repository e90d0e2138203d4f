"""ANALYZE on PostgreSQL: the task and audit tables' payload columns are left out (migration 0015) and
the others sampled with a smaller target (migration 0016)."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection

from tests.support.requirements import require_postgres

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

UNSAMPLED = importlib.import_module("mcptasks.migrations.0015_unsampled_columns").UNSAMPLED
TARGET = importlib.import_module("mcptasks.migrations.0016_smaller_analyze_sample").TARGET


@pytest.fixture(autouse=True)
def _postgres() -> None:
    require_postgres()


def _targets(table: str) -> dict[str, int]:
    """Each column's statistics target (-1: the server's default)."""
    with connection.cursor() as cur:
        # attstattarget is NULL for the default from PostgreSQL 17 on, -1 before.
        cur.execute("SELECT attname, COALESCE(attstattarget::int, -1) FROM pg_attribute "
                    "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped", [table])
        return {name: target for name, target in cur.fetchall()}


@pytest.mark.parametrize("table", sorted(UNSAMPLED))
def test_payload_columns_are_not_sampled_and_the_filtered_ones_are(table: str) -> None:
    targets = _targets(table)
    assert {column: targets[column] for column in UNSAMPLED[table]} == dict.fromkeys(UNSAMPLED[table], 0)
    # Every column a query narrows by keeps its statistics, from the smaller sample.
    kept = {"mcptasks_task": ("status", "tenant_id", "principal_id", "session_id", "lease_expires_at", "kind",
                              "expires_at", "created_at", "tool_name"),
            "mcptasks_auditevent": ("tenant_id", "task_id", "action", "created_at", "chain", "sealed_at")}[table]
    assert {column: targets[column] for column in kept} == dict.fromkeys(kept, TARGET)


@pytest.mark.parametrize("table", sorted(UNSAMPLED))
def test_no_column_brings_back_the_large_sample(table: str) -> None:
    # ANALYZE samples 300 rows per unit of the largest target: one column at the default (a
    # field added without its own migration statement, see migration 0016) makes it 30,000.
    at_default = sorted(column for column, target in _targets(table).items() if target < 0 or target > TARGET)
    assert at_default == [], f"set a statistics target ({TARGET} or 0) for {at_default} in a migration"


def test_analyze_skips_them() -> None:
    with connection.cursor() as cur:
        cur.execute("INSERT INTO mcptasks_auditevent (action, task_id, data, created_at, prev_hash, hash, chain, "
                    "chain_seq, principal_ref) SELECT 'probe', 't' || g, '{}'::jsonb, now(), 'p', 'h' || g, 0, g, 0 "
                    "FROM generate_series(1, 200) g")
        cur.execute("ANALYZE mcptasks_auditevent")
        cur.execute("SELECT attname FROM pg_stats WHERE tablename = 'mcptasks_auditevent'")
        sampled = {row[0] for row in cur.fetchall()}
    assert "task_id" in sampled and "action" in sampled
    assert not sampled & set(UNSAMPLED["mcptasks_auditevent"])
