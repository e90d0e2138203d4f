"""The worker's claim on PostgreSQL as one statement (see :meth:`TaskQuerySet.claim`).

Rank the claimable rows per tenant, lock the best of them with ``FOR UPDATE SKIP LOCKED``,
keep each tenant within its cap, stamp the kept rows and return them with what the tool's
context needs: one round trip and one statement instead of three plus their ORM compilation
(issue 27: the claim was a fifth of a worker's CPU under load).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django.db import connection
from django.db.models import QuerySet
from django.db.models.expressions import RawSQL

from mcptasks.db import prepared
from mcptasks.models.sessions import McpSession

if TYPE_CHECKING:
    from mcptasks.models.taskqueries import TaskQuerySet
    from mcptasks.models.tasks import Task

#: Rows ranked per claimed slot before locking: some of them may be locked by another claimer.
RANKED_PER_SLOT = 4


def _sql(qs: QuerySet[Any, Any]) -> tuple[str, tuple[Any, ...]]:
    sql, params = qs.query.sql_with_params()
    return sql, tuple(params)


def claim_statement(base: TaskQuerySet, *, worker_id: str, limit: int, now: dt.datetime,
                    lease_until: dt.datetime, held: dict[int, int], tenant_cap: int | None,
                    limited: list[str]) -> tuple[bool, list[Task]]:
    """Claim up to ``limit`` rows of ``base`` (claimable, exclusions applied) in one statement.

    The order is :meth:`TaskQuerySet.claim`'s: a row's position is its turn within its tenant
    (oldest first) plus the tenant's runs here (``held``); at most ``RANKED_PER_SLOT`` times
    ``limit`` rows are ranked (without locks: a window cannot be locked), then locked with
    ``SKIP LOCKED`` and re-checked (the predicate is ``base``'s, compiled once by the ORM), and a
    tenant keeps at most ``tenant_cap`` runs counting ``held``. If a claimable row of a tool in
    ``limited`` (tools with ``max_concurrency``) is waiting, the statement locks and claims
    nothing and returns ``(True, [])``: the caller then claims the counted way. Returns
    ``(limited_waiting, claimed rows in claim order)``; atomic by itself (autocommit or a transaction).
    """
    task = base.model
    q = connection.ops.quote_name
    table = q(task._meta.db_table)
    fields = task._meta.concrete_fields
    cand_sql, cand_params = _sql(base.order_by().values_list("pk", "tenant_id"))
    locked_qs = base.order_by().filter(pk__in=RawSQL("SELECT seq FROM picked", ())).values_list("pk")
    locked_sql, locked_params = _sql(locked_qs)
    # The lock clause the ORM's select_for_update(skip_locked=True, of=("self",)) writes, added
    # here: the ORM refuses to compile it outside a transaction, and the statement may run in
    # autocommit (it is atomic by itself).
    locked_sql += f" FOR UPDATE OF {table} SKIP LOCKED"
    if limited:
        probe_sql, probe_params = _sql(base.order_by().filter(tool_name__in=limited).values_list("pk")[:1])
        waiting = f"SELECT EXISTS({probe_sql}) AS limited"
    else:
        waiting, probe_params = "SELECT false AS limited", ()
    sessions, tenants, principals = (
        q(m._meta.db_table) for m in (McpSession, task._meta.get_field("tenant").related_model,
                                     task._meta.get_field("principal").related_model)
    )
    columns = [str(f.column) for f in fields]
    cols = ", ".join(f"s.{q(c)}" for c in columns)
    # Only quoted names and the ORM's own compiled SQL are formatted in; every value is a parameter.
    sql = f"""
        WITH held(tenant_id, n) AS (SELECT * FROM unnest(%s::bigint[], %s::integer[])),
        waiting AS ({waiting}),
        picked AS MATERIALIZED (
            SELECT c.seq, c.tenant_id,
                   row_number() OVER (PARTITION BY c.tenant_id ORDER BY c.seq) + COALESCE(h.n, 0) AS pos
            FROM ({cand_sql}) c (seq, tenant_id) LEFT JOIN held h ON h.tenant_id = c.tenant_id
            WHERE NOT (SELECT limited FROM waiting)
            ORDER BY pos, c.seq LIMIT %s
        ),
        locked (seq) AS MATERIALIZED ({locked_sql}),
        chosen AS MATERIALIZED (
            SELECT r.seq, r.pos FROM (
                SELECT p.seq, p.pos,
                       row_number() OVER (PARTITION BY p.tenant_id ORDER BY p.pos, p.seq) + COALESCE(h.n, 0) AS nth
                FROM picked p JOIN locked l ON l.seq = p.seq LEFT JOIN held h ON h.tenant_id = p.tenant_id
            ) r
            WHERE %s::integer IS NULL OR r.nth <= %s::integer
            ORDER BY r.pos, r.seq LIMIT %s
        ),
        stamped AS (
            UPDATE {table} t SET attempt = t.attempt + 1, worker_id = %s, lease_expires_at = %s,
                   started_at = COALESCE(t.started_at, %s)
            FROM chosen WHERE t.seq = chosen.seq
            RETURNING {", ".join(f"t.{q(c)}" for c in columns)}
        )
        SELECT (SELECT limited FROM waiting), {cols},
               sess.{q("client_capabilities")}, ten.{q("slug")}, pr.{q("identifier")}
        FROM (SELECT 1) one
        LEFT JOIN stamped s ON true
        LEFT JOIN chosen ON chosen.seq = s.seq
        LEFT JOIN {sessions} sess ON sess.{q("id")} = s.{q("session_id")}
        LEFT JOIN {tenants} ten ON ten.{q("id")} = s.{q("tenant_id")}
        LEFT JOIN {principals} pr ON pr.{q("id")} = s.{q("principal_id")}
        ORDER BY chosen.pos, chosen.seq
    """  # noqa: S608
    params = (
        list(held), list(held.values()), *probe_params, *cand_params, limit * RANKED_PER_SLOT,
        *locked_params, tenant_cap, tenant_cap, limit, worker_id, lease_until, now,
    )
    with prepared.cursor() as cur:
        cur.execute(sql, params)
        rows = cur.fetchall()
    limited_waiting = bool(rows and rows[0][0])
    caps_field = McpSession._meta.get_field("client_capabilities")
    claimed: list[Task] = []
    for row in rows:
        if row[1] is None:  # the one row of an empty claim
            continue
        values = [_convert(f, v) for f, v in zip(fields, row[1:1 + len(fields)], strict=True)]
        obj = task.from_db(base.db, [f.attname for f in fields], values)
        caps, slug, ident = row[1 + len(fields):]
        # The same extra attributes as the ORM's annotations of the counted path.
        obj.client_caps = _convert(caps_field, caps)  # type: ignore[attr-defined]
        obj.tenant_slug, obj.principal_ident = slug, ident  # type: ignore[attr-defined]
        claimed.append(obj)
    return limited_waiting, claimed


def _convert(field: Any, value: Any) -> Any:
    """A column's value as the ORM would load it (e.g. JSON decoded)."""
    for converter in field.get_db_converters(connection):
        value = converter(value, field, connection)
    return value
