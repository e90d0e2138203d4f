"""The worker's claim on PostgreSQL as one statement (see :meth:`TaskQuerySet.claim`).

Rank the claimable rows per tenant, lock the best of them with ``FOR UPDATE SKIP LOCKED``,
keep each tenant within its cap, stamp the kept rows and return them with what the tool's
context needs: one round trip and one statement instead of three plus their ORM compilation
(issue 27: the claim was a fifth of a worker's CPU under load). The statement's text is fixed
(lists are array parameters), so it is prepared once per connection.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django.db import connection

from mcptasks.db import prepared
from mcptasks.models.sessions import McpSession
from mcptasks.models.status import LIVE

if TYPE_CHECKING:
    from mcptasks.models.tasks import Task


class Claimed(list["Task"]):
    """The runs a claim took, in claim order, and whether it passed over claimable rows.

    ``passed_over``: the claim saw claimable rows it did not take (locked by a concurrent
    claimer, beyond its limit or its tenant cap, or taken meanwhile). Fewer runs than asked for
    then does not mean none are left: a concurrent claim locks every row it ranks but keeps only
    its share, and the rows skipped here are free again once it ends (issue 27: a worker that
    believed the queue empty idled until its poll while thousands of tasks waited).
    """

    passed_over: bool = False


#: Rows ranked per claimed slot before locking: some of them may be locked by another claimer.
RANKED_PER_SLOT = 4

_statements: dict[bool, str] = {}


def claimable_sql(alias: str, *, lease: str = "any") -> str:
    """:meth:`TaskQuerySet.claimable <mcptasks.models.TaskQuerySet.claimable>` as SQL over the
    task table aliased ``alias``, with the ``%(now)s`` placeholder; also leaves out the task ids
    in ``%(skip)s`` and the tenants in ``%(capped)s`` (arrays). Written out rather than compiled
    by the ORM on every claim (a third of the claim's CPU); ``tests/mcptasks/worker/
    test_claim_statement.py`` holds the two to the same rows. ``lease`` narrows it to the rows
    never leased (``"unleased"``) or whose lease lapsed (``"lapsed"``): each half alone is one
    plain index scan of ``task_claim_idx`` (see :func:`_build`)."""
    q = connection.ops.quote_name
    live = ", ".join(f"'{status}'" for status in LIVE)  # our own constants: the index sees literals
    column = f"{alias}.{q('lease_expires_at')}"
    leased = {"unleased": f"{column} IS NULL", "lapsed": f"{column} < %(now)s",
              "any": f"({column} IS NULL OR {column} < %(now)s)"}[lease]
    return (
        f"{alias}.{q('status')} IN ({live}) AND NOT {alias}.{q('cancel_requested')} "
        f"AND {leased} "
        f"AND {alias}.{q('attempt')} < {alias}.{q('max_attempts')} "
        f"AND ({alias}.{q('run_after')} IS NULL OR {alias}.{q('run_after')} <= %(now)s) "
        f"AND {alias}.{q('task_id')} <> ALL(%(skip)s::text[]) AND {alias}.{q('tenant_id')} <> ALL(%(capped)s::bigint[])"
    )


def _build(task: type[Task], *, probe: bool) -> str:
    """The statement (with or without the probe for waiting tools in ``%(limited)s``), built once."""
    found = _statements.get(probe)
    if found is not None:
        return found
    q = connection.ops.quote_name
    table = q(task._meta.db_table)
    pk = q(str(task._meta.pk.column))
    columns = [str(f.column) for f in task._meta.concrete_fields]
    cols = ", ".join(f"s.{q(c)}" for c in columns)
    sessions, tenants, principals = (
        q(m._meta.db_table) for m in (McpSession, task._meta.get_field("tenant").related_model,
                                     task._meta.get_field("principal").related_model)
    )
    if probe:
        waiting = (f"SELECT EXISTS(SELECT 1 FROM {table} w WHERE {claimable_sql('w')} "  # noqa: S608
                   f"AND w.{q('tool_name')} = ANY(%(limited)s::text[])) AS limited")
    else:
        waiting = "SELECT false AS limited"
    # Only quoted names and our own constants are formatted in; every value is a parameter.
    sql = f"""
        WITH held(tenant_id, n) AS (SELECT * FROM unnest(%(held_tenants)s::bigint[], %(held_runs)s::integer[])),
        waiting AS ({waiting}),
        picked AS MATERIALIZED (
            SELECT c.{pk} AS seq, c.{q("tenant_id")} AS tenant_id,
                   row_number() OVER (PARTITION BY c.{q("tenant_id")} ORDER BY c.{pk}) + COALESCE(h.n, 0) AS pos
            FROM (
                -- Two halves, not one OR: each is a plain index scan, which marks the index
                -- entries of dead row versions (every claim and finish leaves some: status and
                -- lease are indexed, so no update is HOT) so later scans skip them; a bitmap scan
                -- of the OR never does, and visited every such row's heap page until a vacuum.
                SELECT u.{pk}, u.{q("tenant_id")} FROM {table} u WHERE {claimable_sql("u", lease="unleased")}
                UNION ALL
                SELECT x.{pk}, x.{q("tenant_id")} FROM {table} x WHERE {claimable_sql("x", lease="lapsed")}
            ) c LEFT JOIN held h ON h.tenant_id = c.{q("tenant_id")}
            WHERE NOT (SELECT limited FROM waiting)
            ORDER BY pos, c.{pk} LIMIT %(ranked)s
        ),
        locked (seq) AS MATERIALIZED (
            SELECT l.{pk} FROM {table} l WHERE l.{pk} IN (SELECT seq FROM picked) AND {claimable_sql("l")}
            FOR UPDATE OF l SKIP LOCKED
        ),
        chosen AS MATERIALIZED (
            SELECT r.seq, r.pos FROM (
                SELECT p.seq, p.pos,
                       row_number() OVER (PARTITION BY p.tenant_id ORDER BY p.pos, p.seq) + COALESCE(h.n, 0) AS nth
                FROM picked p JOIN locked l ON l.seq = p.seq LEFT JOIN held h ON h.tenant_id = p.tenant_id
            ) r
            WHERE CAST(%(cap)s AS integer) IS NULL OR r.nth <= CAST(%(cap)s AS integer)
            ORDER BY r.pos, r.seq LIMIT %(limit)s
        ),
        stamped AS (
            UPDATE {table} t SET {q("attempt")} = t.{q("attempt")} + 1, {q("worker_id")} = %(worker)s,
                   {q("lease_expires_at")} = %(lease_until)s, {q("started_at")} = COALESCE(t.{q("started_at")}, %(now)s)
            FROM chosen WHERE t.{pk} = chosen.seq
            RETURNING {", ".join(f"t.{q(c)}" for c in columns)}
        )
        SELECT (SELECT limited FROM waiting), (SELECT count(*) FROM picked), {cols},
               sess.{q("client_capabilities")}, ten.{q("slug")}, pr.{q("identifier")}
        FROM (SELECT 1) one
        LEFT JOIN stamped s ON true
        LEFT JOIN chosen ON chosen.seq = s.{pk}
        LEFT JOIN {sessions} sess ON sess.{q("id")} = s.{q("session_id")}
        LEFT JOIN {tenants} ten ON ten.{q("id")} = s.{q("tenant_id")}
        LEFT JOIN {principals} pr ON pr.{q("id")} = s.{q("principal_id")}
        ORDER BY chosen.pos, chosen.seq
    """  # noqa: S608
    _statements[probe] = sql
    return sql


def claim_statement(task: type[Task], *, worker_id: str, limit: int, now: dt.datetime, lease_until: dt.datetime,
                    held: dict[int, int], tenant_cap: int | None, limited: list[str], skip: list[str],
                    capped: list[int]) -> tuple[bool, Claimed]:
    """Claim up to ``limit`` claimable rows (not in ``skip``, not of a tenant in ``capped``) in one statement.

    The order is :meth:`TaskQuerySet.claim`'s: a row's position is its turn within its tenant
    (oldest first) plus the tenant's runs here (``held``); at most ``RANKED_PER_SLOT`` times
    ``limit`` rows are ranked (without locks: a window cannot be locked), then locked with
    ``SKIP LOCKED`` and re-checked, and a tenant keeps at most ``tenant_cap`` runs counting
    ``held``. If a claimable row of a tool in ``limited`` (tools with ``max_concurrency``) is
    waiting, the statement locks and claims nothing and returns ``(True, [])``: the caller then
    claims the counted way. Returns ``(limited_waiting, claimed rows in claim order)``; atomic by
    itself (autocommit or a transaction). Prepared on the server where that is safe
    (:mod:`mcptasks.db.prepared`).
    """
    fields = task._meta.concrete_fields
    params = {
        "held_tenants": list(held), "held_runs": list(held.values()), "limited": limited, "now": now,
        "skip": skip, "capped": capped, "ranked": limit * RANKED_PER_SLOT, "cap": tenant_cap, "limit": limit,
        "worker": worker_id, "lease_until": lease_until,
    }
    rows = prepared.fetchall(_build(task, probe=bool(limited)), params)
    limited_waiting = bool(rows and rows[0][0])
    caps_field = McpSession._meta.get_field("client_capabilities")
    claimed = Claimed()
    for row in rows:
        if row[2] is None:  # the one row of an empty claim
            continue
        values = [_convert(f, v) for f, v in zip(fields, row[2:2 + len(fields)], strict=True)]
        obj = task.from_db("default", [f.attname for f in fields], values)
        caps, slug, ident = row[2 + len(fields):]
        # The same extra attributes as the ORM's annotations of the counted path.
        obj.client_caps = _convert(caps_field, caps)  # type: ignore[attr-defined]
        obj.tenant_slug, obj.principal_ident = slug, ident  # type: ignore[attr-defined]
        claimed.append(obj)
    claimed.passed_over = bool(rows) and int(rows[0][1]) > len(claimed)
    return limited_waiting, claimed


def _convert(field: Any, value: Any) -> Any:
    """A column's value as the ORM would load it (e.g. JSON decoded)."""
    for converter in field.get_db_converters(connection):
        value = converter(value, field, connection)
    return value
