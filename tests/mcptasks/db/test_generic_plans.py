"""Issue 27: the service's prepared statements are planned once per connection, not on every execution."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.utils import timezone

from mcptasks.conf import AppSettings
from mcptasks.db import async_sql as fastreads
from mcptasks.db import config as dbconfig
from mcptasks.models import Task
from tests.support.factories import make_auth, task_row
from tests.support.requirements import require_postgres


def test_generic_plans_are_a_startup_option_of_direct_connections_only() -> None:
    direct = dbconfig.pg_connection_options(AppSettings(DB_POOLER="none"))
    assert "-c plan_cache_mode=force_generic_plan" in direct["options"]
    assert "-c lock_timeout=" in direct["options"]  # the timeouts stay beside it
    off = dbconfig.pg_connection_options(AppSettings(DB_POOLER="none", DB_GENERIC_PLANS=False))
    assert "plan_cache_mode" not in off["options"] and "-c lock_timeout=" in off["options"]
    # A transaction pooler refuses startup options, and nothing is prepared behind it.
    assert "options" not in dbconfig.pg_connection_options(AppSettings(DB_POOLER="transaction"))


@pytest.mark.django_db
def test_the_prepared_claim_is_never_custom_planned(settings: Any) -> None:
    """PostgreSQL's default plans a prepared statement anew for its first five executions, and the
    claim on every one after (its custom plans cost less than its generic plan): as much of the
    server's CPU as running it. Here every execution uses the one generic plan."""
    require_postgres()
    settings.MCPTASKS = {**settings.MCPTASKS, "DB_POOLER": "none"}
    auth = make_auth()
    rows = [task_row("plain", auth=auth) for _ in range(7)]
    now = timezone.now()
    claimed = [t for _ in range(7) for t in Task.objects.claim(
        worker_id="w1", limit=1, now=now, lease_until=now + dt.timedelta(seconds=30))]
    assert [t.task_id for t in claimed] == [r.task_id for r in rows]
    with connection.cursor() as cur:
        cur.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
                    ["%picked AS MATERIALIZED%"])
        plans = cur.fetchall()
    assert plans, "the claim should be a prepared statement"
    assert sum(custom for _generic, custom in plans) == 0, plans
    assert sum(generic for generic, _custom in plans) >= 7, plans


@pytest.mark.django_db(transaction=True)
def test_the_async_read_connection_uses_generic_plans() -> None:
    """The web processes' batched reads: one statement text per batch size, each prepared on the
    async connection, so five custom plans per size and connection without this."""
    require_postgres()
    fastreads._failed_until = 0.0

    async def mode() -> str:
        try:
            conn = await fastreads._connection()
            cur = await conn.execute("SHOW plan_cache_mode")
            row = await cur.fetchone()
            return str(row[0])
        finally:
            await fastreads.close()

    assert async_to_sync(mode)() == "force_generic_plan"
