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

#: Busy tenants one claim ranks at least (more if it ranks more rows): each costs one index descent.
TENANTS_PER_CLAIM = 64


class _Ring:
    """Where this process's next claim starts on the ring of busy tenants (by tenant id): after
    the last tenant its previous claim served, when that claim could not rank them all. A
    process's claims come one at a time (the worker's database thread); concurrent ones would
    only start at the same place."""

    after = 0


_ring = _Ring()

_statements: dict[bool, str] = {}

#: The live statuses as SQL literals (our own constants): index predicates are matched on literals.
_LIVE_SQL = ", ".join(f"'{status}'" for status in LIVE)


def claimable_sql(alias: str, *, lease: str = "any") -> str:
    """:meth:`TaskQuerySet.claimable <mcptasks.models.TaskQuerySet.claimable>` as SQL over the
    task table aliased ``alias``, with the ``%(now)s`` placeholder; also leaves out the task ids
    in ``%(skip)s`` and the tenants in ``%(capped)s`` (arrays). Written out rather than compiled
    by the ORM on every claim (a third of the claim's CPU); ``tests/mcptasks/worker/
    test_claim_statement.py`` holds the two to the same rows. ``lease`` narrows it to the rows
    never leased (``"unleased"``) or whose lease lapsed (``"lapsed"``): each half alone is one
    plain index scan (of ``task_backlog_idx`` and ``task_claim_idx``). The claim itself
    (:func:`_build`) reads the never-leased half from ``task_backlog_idx`` alone and applies
    the whole filter to the rows it locked."""
    q = connection.ops.quote_name
    column = f"{alias}.{q('lease_expires_at')}"
    leased = {"unleased": f"{column} IS NULL", "lapsed": f"{column} < %(now)s",
              "any": f"({column} IS NULL OR {column} < %(now)s)"}[lease]
    return (
        f"{alias}.{q('status')} IN ({_LIVE_SQL}) AND NOT {alias}.{q('cancel_requested')} "
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
    tool = q("tool_name")
    if probe:
        # Among the rows ranked and locked, not the whole table: a limited tool's row this claim
        # would not take anyway changes nothing (the counted path ranks the same rows first),
        # and an EXISTS over every waiting row read the whole backlog on each claim (issue 27).
        waiting = "SELECT EXISTS(SELECT 1 FROM locked l WHERE l.ok AND l.tool = ANY(%(limited)s::text[])) AS limited"
    else:
        waiting = "SELECT false AS limited"
    # The backlog index's predicate (task_backlog_idx), so the planner can read that index.
    backlog = f"b.{q('status')} IN ({_LIVE_SQL}) AND b.{q('lease_expires_at')} IS NULL"
    tenant = q("tenant_id")

    def first_after(after: str) -> str:
        """The first backlog row (tenant, seq) of the first busy tenant after ``after`` (a
        parameter or a column), else, when the claim started past the ring's start, of the
        first busy tenant: two index descents at most."""
        after_it = (f"(SELECT b.{tenant}, b.{pk} FROM {table} b WHERE {backlog} AND b.{tenant} > {after} "  # noqa: S608
                    f"ORDER BY b.{tenant}, b.{pk} LIMIT 1)")
        wrapped = (f"(SELECT b.{tenant}, b.{pk} FROM {table} b WHERE {backlog} AND %(after)s::bigint > 0 "  # noqa: S608
                   f"ORDER BY b.{tenant}, b.{pk} LIMIT 1)")
        return f"(SELECT * FROM ({after_it} UNION ALL {wrapped}) f LIMIT 1)"  # noqa: S608

    # Only quoted names and our own constants are formatted in; every value is a parameter.
    sql = f"""
        WITH RECURSIVE
        held(tenant_id, n) AS (SELECT * FROM unnest(%(held_tenants)s::bigint[], %(held_runs)s::integer[])),
        busy(tenant_id, seq, n, first) AS (
            -- The tenants with a backlog and each one's first backlog row, one index descent
            -- each (a skip scan of the backlog index), at most %(tenants)s of them, round the ring
            -- of tenant ids from the one after %(after)s (where this process's previous claim
            -- stopped): a claim costs what those tenants' first rows cost, not what the whole
            -- backlog does (issue 27: 11 ms a claim behind 5,000 waiting rows of one tenant, 30
            -- ms behind 20,000).
            SELECT s.tenant_id, s.seq, 1, s.tenant_id FROM {first_after("%(after)s")} AS s(tenant_id, seq)
            UNION ALL
            SELECT s.tenant_id, s.seq, busy.n + 1, busy.first
            FROM busy CROSS JOIN LATERAL {first_after("busy.tenant_id")} AS s(tenant_id, seq)
            WHERE busy.n < %(tenants)s AND s.tenant_id <> busy.first
        ),
        picked AS MATERIALIZED (
            SELECT c.{pk} AS seq, c.{tenant} AS tenant_id,
                   row_number() OVER (PARTITION BY c.{tenant} ORDER BY c.{pk}) + COALESCE(h.n, 0) AS pos
            FROM (
                -- Two halves, not one OR: each is a plain index scan, which marks the index
                -- entries of dead row versions (every claim and finish leaves some: status and
                -- lease are indexed, so no update is HOT) so later scans skip them; a bitmap scan
                -- of the OR never does, and visited every such row's heap page until a vacuum.
                -- A row's position is at least its turn within its tenant, so no tenant's rows
                -- past the first %(ranked)s can be ranked in: each busy tenant gives that many.
                SELECT u.{pk}, u.{tenant} FROM busy CROSS JOIN LATERAL (
                    -- From the tenant's first backlog row on (past the index entries of rows
                    -- claimed since the last vacuum), from the backlog index alone (no filter
                    -- here: `locked` checks each row), in that index's order: only that
                    -- index gives this order (with tenant_id = a constant, the planner may walk
                    -- the primary key through every older row of every tenant, or sort all of
                    -- the tenant's rows).
                    SELECT b.{pk}, b.{tenant} FROM {table} b
                    WHERE {backlog} AND (b.{tenant}, b.{pk}) >= (busy.tenant_id, busy.seq)
                          AND b.{tenant} <= busy.tenant_id
                    ORDER BY b.{tenant}, b.{pk} LIMIT %(ranked)s
                ) u
                WHERE u.{tenant} = busy.tenant_id AND busy.tenant_id <> ALL(%(capped)s::bigint[])
                UNION ALL
                SELECT x.{pk}, x.{tenant} FROM {table} x WHERE {claimable_sql("x", lease="lapsed")}
            ) c LEFT JOIN held h ON h.tenant_id = c.{tenant}
            ORDER BY pos, c.{pk} LIMIT %(ranked)s
        ),
        locked (seq, ok, tool) AS MATERIALIZED (
            -- Locked by primary key alone, and checked once locked (FOR UPDATE returns the
            -- row's newest version): with the claimable filters in this scan, a plan made on
            -- statistics that saw no waiting rows walked every live row by the status index
            -- (issue 27: 50 ms a claim behind 3,000 rows).
            SELECT l.{pk}, {claimable_sql("l")}, l.{tool} FROM {table} l
            WHERE l.{pk} = ANY(ARRAY(SELECT seq FROM picked))
            FOR UPDATE OF l SKIP LOCKED
        ),
        waiting AS ({waiting}),
        chosen AS MATERIALIZED (
            SELECT r.seq, r.pos FROM (
                SELECT p.seq, p.pos,
                       row_number() OVER (PARTITION BY p.tenant_id ORDER BY p.pos, p.seq) + COALESCE(h.n, 0) AS nth
                FROM picked p JOIN locked l ON l.seq = p.seq AND l.ok LEFT JOIN held h ON h.tenant_id = p.tenant_id
            ) r
            WHERE (CAST(%(cap)s AS integer) IS NULL OR r.nth <= CAST(%(cap)s AS integer))
                  AND NOT (SELECT limited FROM waiting)
            ORDER BY r.pos, r.seq LIMIT %(limit)s
        ),
        stamped AS (
            UPDATE {table} t SET {q("attempt")} = t.{q("attempt")} + 1, {q("worker_id")} = %(worker)s,
                   {q("lease_expires_at")} = %(lease_until)s, {q("started_at")} = COALESCE(t.{q("started_at")}, %(now)s)
            FROM chosen WHERE t.{pk} = chosen.seq
            RETURNING {", ".join(f"t.{q(c)}" for c in columns)}
        )
        SELECT (SELECT limited FROM waiting), (SELECT count(*) FROM picked),
               -- Where the next claim starts: after the last tenant served (by ring order), so
               -- the window's other tenants come first next time; after the window if none was.
               COALESCE((SELECT busy.tenant_id FROM busy JOIN stamped st ON st.{tenant} = busy.tenant_id
                         ORDER BY busy.n DESC LIMIT 1),
                        (SELECT busy.tenant_id FROM busy ORDER BY busy.n DESC LIMIT 1)),
               (SELECT count(*) FROM busy), {cols},
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
    ``limit`` rows are ranked (without locks: a window cannot be locked), read from the first
    rows of at most ``max(that, TENANTS_PER_CLAIM)`` busy tenants round the ring (see
    :class:`_Ring`; ``passed_over`` when there were more), then locked by primary key with
    ``SKIP LOCKED`` and checked (:func:`claimable_sql`) on their newest version, and a tenant
    keeps at most ``tenant_cap`` runs counting ``held``. If a claimable row of a tool in
    ``limited`` (tools with ``max_concurrency``) is among the locked rows, the statement claims
    nothing (its locks end with it) and returns ``(True, [])``: the caller then claims the
    counted way. Returns ``(limited_waiting, claimed rows in claim order)``; atomic by
    itself (autocommit or a transaction). Prepared on the server where that is safe
    (:mod:`mcptasks.db.prepared`).
    """
    fields = task._meta.concrete_fields
    window = max(limit * RANKED_PER_SLOT, TENANTS_PER_CLAIM)
    params = {
        "held_tenants": list(held), "held_runs": list(held.values()), "limited": limited, "now": now,
        "skip": skip, "capped": capped, "ranked": limit * RANKED_PER_SLOT, "cap": tenant_cap, "limit": limit,
        "worker": worker_id, "lease_until": lease_until, "after": _ring.after, "tenants": window,
    }
    rows = prepared.fetchall(_build(task, probe=bool(limited)), params)
    limited_waiting = bool(rows and rows[0][0])
    caps_field = McpSession._meta.get_field("client_capabilities")
    claimed = Claimed()
    for row in rows:
        if row[4] is None:  # the one row of an empty claim
            continue
        values = [_convert(f, v) for f, v in zip(fields, row[4:4 + len(fields)], strict=True)]
        obj = task.from_db("default", [f.attname for f in fields], values)
        caps, slug, ident = row[4 + len(fields):]
        # The same extra attributes as the ORM's annotations of the counted path.
        obj.client_caps = _convert(caps_field, caps)  # type: ignore[attr-defined]
        obj.tenant_slug, obj.principal_ident = slug, ident  # type: ignore[attr-defined]
        claimed.append(obj)
    # More busy tenants than one claim ranks: the next claim starts after the last one served
    # here, and the worker looks again soon even if this one came up short.
    truncated = bool(rows) and int(rows[0][3]) >= window
    _ring.after = int(rows[0][2]) if truncated else 0
    claimed.passed_over = bool(rows) and (int(rows[0][1]) > len(claimed) or truncated)
    return limited_waiting, claimed


def _convert(field: Any, value: Any) -> Any:
    """A column's value as the ORM would load it (e.g. JSON decoded)."""
    for converter in field.get_db_converters(connection):
        value = converter(value, field, connection)
    return value
