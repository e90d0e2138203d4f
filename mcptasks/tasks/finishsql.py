"""A batch of worker outcomes written on PostgreSQL as one statement (see
:func:`mcptasks.tasks.transitions.finish_runs`).

Data-modifying CTEs lock the runs' rows in key order, write each outcome where the run is still
live at its attempt, drop the won tasks' unanswered input requests, append their audit events,
store the stream events their changes owe (:func:`mcptasks.streams.events.one_statement_publish_sql`)
and give their quota slots back (tenant rows, then principal rows, each in key order: the order
creation and cancellation lock in, so they never deadlock). In autocommit the locks last only
while the server runs the statement, never across a round trip to Python (issue 27: the ORM
transaction was seven round trips, its COMMIT sent with the tenant's row locked).

A batch with a tenant that has an enabled webhook endpoint writes nothing here: its outbox rows
are rendered in Python in the ORM transaction (:mod:`mcptasks.tasks.webhook_outbox`), so the
statement says so and the caller takes that path.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from mcptasks import conf
from mcptasks.db import prepared
from mcptasks.models.audit import AuditEvent
from mcptasks.models.status import LIVE
from mcptasks.models.taskqueries import Outcome
from mcptasks.models.tasks import Task, TaskMessage
from mcptasks.streams import events
from tenants import quotas
from tenants.models import WebhookEndpoint

_statement: str | None = None


def _build() -> str:
    """The statement (built once: only quoted model metadata is formatted in)."""
    global _statement
    if _statement is None:
        q = connection.ops.quote_name
        task, message = q(Task._meta.db_table), q(TaskMessage._meta.db_table)
        audit, hooks = q(AuditEvent._meta.db_table), q(WebhookEndpoint._meta.db_table)
        pk = q(str(Task._meta.pk.column))
        release = quotas.one_statement_release_sql(released="won", fallback="%(fallback)s")
        publish = events.one_statement_publish_sql(notes="notes", now="%(now)s", cap="%(cap)s")
        # `hooked` and `locked` find the runs' rows by key (`= ANY` of the array: a primary-key
        # index scan), never by joining the task table to `input`: a plan made while the table
        # was small hashes the whole table, and kept as the generic plan it read every task's
        # page on every finish (999 buffers a call after half a minute of the e2e load).
        _statement = f"""
            WITH input AS (
                SELECT * FROM unnest(%(pks)s::bigint[], %(attempts)s::integer[], %(statuses)s::text[],
                                     %(messages)s::text[], %(results)s::text[], %(errors)s::text[],
                                     %(notes)s::text[], %(default_streams)s::text[]) WITH ORDINALITY
                    AS i (pk, attempt, status, message, result, error, note, default_stream, ord)
            ),
            hooked AS (
                SELECT EXISTS (
                    SELECT 1 FROM {hooks} e WHERE e.{q("enabled")} AND e.{q("tenant_id")} IN (
                        SELECT t.{q("tenant_id")} FROM {task} t WHERE t.{pk} = ANY(%(pks)s::bigint[]))
                ) AS hooked
            ),
            locked AS MATERIALIZED (
                SELECT t.{pk} AS pk FROM {task} t JOIN input i ON t.{pk} = i.pk AND t.{q("attempt")} = i.attempt
                WHERE t.{pk} = ANY(%(pks)s::bigint[]) AND t.{q("status")} = ANY(%(live)s::text[])
                  AND NOT (SELECT hooked FROM hooked)
                ORDER BY t.{pk} FOR NO KEY UPDATE OF t
            ),
            won AS (
                UPDATE {task} t SET {q("status")} = i.status,
                       {q("status_message")} = COALESCE(i.message, t.{q("status_message")}),
                       {q("result")} = COALESCE(i.result::jsonb, t.{q("result")}),
                       {q("error")} = COALESCE(i.error::jsonb, t.{q("error")}),
                       {q("last_updated_at")} = %(now)s, {q("finished_at")} = %(now)s,
                       {q("lease_expires_at")} = NULL
                FROM input i
                WHERE t.{pk} = i.pk AND t.{pk} IN (SELECT pk FROM locked)
                  AND t.{q("attempt")} = i.attempt AND t.{q("status")} = ANY(%(live)s::text[])
                RETURNING t.{pk} AS pk, t.{q("tenant_id")} AS tenant_id, t.{q("principal_id")} AS principal_id,
                          t.{q("task_id")} AS task_id, t.{q("kind")} AS kind, i.status, i.message,
                          t.{q("session_id")} AS session_id, t.{q("stream_id")} AS stream_id
            ),
            dropped AS (
                DELETE FROM {message} m WHERE m.{q("task_id")} IN (SELECT pk FROM won)
                AND m.{q("answered_at")} IS NULL
            ),
            audited AS (
                INSERT INTO {audit} ({q("tenant_id")}, {q("principal_id")}, {q("chain")}, {q("principal_ref")},
                                     {q("action")}, {q("task_id")}, {q("data")}, {q("created_at")},
                                     {q("prev_hash")}, {q("hash")})
                SELECT w.tenant_id, w.principal_id, COALESCE(w.tenant_id, 0), w.principal_id,
                       'task.' || w.status, w.task_id,
                       CASE WHEN COALESCE(w.message, '') = '' THEN '{{}}'::jsonb
                            ELSE jsonb_build_object('statusMessage', w.message) END,
                       %(now)s, '', ''
                FROM won w WHERE w.kind = %(task_kind)s
            ),
            {release},
            notes AS (
                SELECT i.ord, w.session_id, COALESCE(NULLIF(w.stream_id, ''), i.default_stream) AS stream,
                       i.note AS data
                FROM won w JOIN input i ON i.pk = w.pk
                WHERE i.note IS NOT NULL AND COALESCE(NULLIF(w.stream_id, ''), i.default_stream) IS NOT NULL
            ),
            {publish},
            unstored AS (
                SELECT * FROM notes WHERE stream NOT IN (SELECT stream_id FROM pub_advanced)
                  AND left(stream, 1) <> %(get_prefix)s
            )
            SELECT (SELECT hooked FROM hooked), ARRAY(SELECT pk FROM won),
                   ARRAY(SELECT stream_id FROM pub_stored ORDER BY stream_id, seq),
                   ARRAY(SELECT seq FROM pub_stored ORDER BY stream_id, seq),
                   ARRAY(SELECT data FROM pub_stored ORDER BY stream_id, seq),
                   ARRAY(SELECT session_id FROM unstored ORDER BY ord),
                   ARRAY(SELECT stream FROM unstored ORDER BY ord),
                   ARRAY(SELECT data FROM unstored ORDER BY ord)
        """  # noqa: S608
    return _statement


@dataclass
class Written:
    """What :func:`finish` wrote: the pks whose outcome was written, the stream events stored with
    them as ``(stream_id, seq, data)`` in stream order, and the notes whose stream had no cursor
    row yet as ``(session_id, stream_id, data)`` (not stored: the caller publishes them), but
    for a GET stream never opened, which gets nothing."""

    won: list[int]
    stored: list[tuple[str, int, str]] = field(default_factory=list)
    unstored: list[tuple[str, str, str]] = field(default_factory=list)


def finish(outcomes: list[Outcome], *, now: dt.datetime,
           notes: list[tuple[str | None, str | None]]) -> Written | None:
    """Write ``outcomes`` in one statement, with the stream event each written one owes.

    ``notes`` gives, per outcome, the JSON text of the message its change puts on a stream and
    the stream it goes to when the task has no stream bound (None: only a bound one), as
    :func:`mcptasks.tasks.fanout.notes_for` computes them. None when nothing was written because
    a task of the batch belongs to a tenant with an enabled webhook endpoint (the caller writes
    the batch in the ORM transaction instead). Call outside a transaction on a direct connection
    (autocommit), or inside one behind a transaction pooler.
    """
    params: dict[str, Any] = {
        "pks": [o.pk for o in outcomes],
        "attempts": [o.attempt for o in outcomes],
        "statuses": [o.status for o in outcomes],
        "messages": [o.message for o in outcomes],
        "results": [_json(o.result) for o in outcomes],
        "errors": [_json(o.error) for o in outcomes],
        "notes": [note for note, _stream in notes],
        "default_streams": [stream for _note, stream in notes],
        "live": list(LIVE),
        "now": now,
        "task_kind": Task.Kind.TASK.value,
        "fallback": quotas.default_tenant_limit(),
        "cap": conf.get().STREAM_MAX_EVENTS,
        # A GET stream without a cursor row was never opened: its notes are dropped, not
        # published the slow way (mcptasks.streams.events).
        "get_prefix": events.GET_PREFIX,
    }
    # Prepared once per connection where that is safe: planning it cost as much as running it.
    [(hooked, won, streams, seqs, datas, sessions, unstored_streams, unstored_datas)] = prepared.fetchall(
        _build(), params)
    if hooked:
        return None
    return Written(won=list(won), stored=list(zip(streams, seqs, datas, strict=True)),
                   unstored=list(zip(sessions, unstored_streams, unstored_datas, strict=True)))


def _json(value: dict[str, Any] | None) -> str | None:
    """An outcome's payload as the JSONField would store it (None: keep the stored value)."""
    return None if value is None else json.dumps(value, separators=(",", ":"), allow_nan=False)
