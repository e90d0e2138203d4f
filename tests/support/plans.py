"""Plans of the worker's prepared statements as PostgreSQL runs them: generic, from their first execution."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import connection, transaction

from mcptasks.db import prepared


def generic_rows_read(sql: str, params: Mapping[str, Any], *, table: str) -> int:
    """The rows the scans of ``table`` return when ``sql`` (``%(name)s`` placeholders) runs with
    ``params`` on its generic plan (``plan_cache_mode = force_generic_plan``, as
    ``DB_GENERIC_PLANS`` sets on the worker's connections), by ``EXPLAIN ANALYZE`` (rolled back).

    A generic plan is made once, from the statistics of that moment, and kept: a plan that looks
    fine with the parameters' values in hand (a custom plan) can read the whole backlog here.
    """
    numbered, names = prepared._number(sql)

    def walk(node: dict[str, Any]) -> int:
        own = node["Actual Rows"] * node["Actual Loops"] if node.get("Relation Name") == table else 0
        return own + sum(walk(child) for child in node.get("Plans", []))

    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute("PREPARE plan_probe AS " + numbered)
        try:
            cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE plan_probe({', '.join(['%s'] * len(names))})",
                        [params[name] for name in names])
            plan = cur.fetchone()[0][0]["Plan"]
        finally:
            cur.execute("DEALLOCATE plan_probe")
            transaction.set_rollback(True)
    return int(walk(plan))
