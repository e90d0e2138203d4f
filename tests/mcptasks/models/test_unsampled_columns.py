"""The task and audit tables' payload columns are left out of ANALYZE on PostgreSQL (migration 0015)."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection

from tests.support.requirements import require_postgres

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

UNSAMPLED = importlib.import_module("mcptasks.migrations.0015_unsampled_columns").UNSAMPLED


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
    # Every column a query narrows by keeps its statistics.
    kept = {"mcptasks_task": ("status", "tenant_id", "principal_id", "session_id", "lease_expires_at", "kind",
                              "expires_at", "created_at", "tool_name"),
            "mcptasks_auditevent": ("tenant_id", "task_id", "action", "created_at", "chain", "sealed_at")}[table]
    assert {column: targets[column] for column in kept} == dict.fromkeys(kept, -1)


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
