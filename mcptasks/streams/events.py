"""The SSE event store: stream ids, stored events and their cursors, and what a stream answers.

A **stream event** (:func:`publish`) is a JSON-RPC message meant for exactly one SSE stream of a
session. It is stored (``StreamEvent``, numbered under the stream's ``StreamCursor`` row) for
replay with ``Last-Event-ID`` and, after commit, pushed to the stream's group
(:func:`mcptasks.streams.signals.stream_group`), which holds at most one live HTTP connection.

A session's GET stream exists from the first time the client opens it (:func:`open_get_stream`
creates its cursor row). Until then nothing is stored or pushed for it: a fresh GET starts at the
stream's end, and a client can resume only after an event id the stream gave it, so no one could
ever read those events (issue 27: one stored event and one push per task for clients that poll).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.models import Case, Max, Q, Value, When
from django.utils import timezone

from mcptasks import conf
from mcptasks.models import StreamCursor, StreamEvent
from mcptasks.streams.signals import hashed, send, send_many, stream_group


def new_stream_id(prefix: str) -> str:
    """A fresh stream id: ``p`` POST, ``r`` tasks/result; GET streams use :func:`get_stream_id`."""
    return prefix + secrets.token_hex(8)


#: The first character of every GET stream id (POST ``p``, tasks/result ``r``).
GET_PREFIX = "g"


def get_stream_id(session_id: str) -> str:
    """The id of a session's standalone GET stream (stable for the session's life)."""
    return GET_PREFIX + hashed("get:" + session_id)[:16]


def is_get_stream(stream_id: str) -> bool:
    """Whether ``stream_id`` is a session's GET stream (stored for only once it was opened)."""
    return stream_id.startswith(GET_PREFIX)


def parse_event_id(event_id: str) -> tuple[str, int] | None:
    """Split an SSE event id into (stream id, sequence); None if malformed.

    Data events are ``<stream>.<seq>``; priming events add ``-<nonce>`` so that every id is
    unique within the session even when a stream is re-opened at the same position.
    """
    stream, _, seq = event_id.rpartition(".")
    seq = seq.split("-", 1)[0]
    if not stream or not seq.isdigit() or len(stream) > 64:
        return None
    return stream, int(seq)


def priming_id(stream_id: str, seq: int) -> str:
    """A unique event id for a priming event positioned after event ``seq`` of the stream."""
    return f"{stream_id}.{seq}-{secrets.token_hex(4)}"


def _locked_cursor(*, session_id: str, stream_id: str) -> StreamCursor:
    """The stream's cursor row, created if missing, locked until the transaction ends."""
    # A missing cursor starts after the newest stored event, not at 0: cleanup may have
    # removed the cursor of a stream whose session row is gone (tasks enqueued without a
    # client) while its events are still retained.
    cursor, _ = StreamCursor.objects.select_for_update().get_or_create(
        stream_id=stream_id,
        defaults={
            "session_id": session_id,
            # A callable: evaluated only when the row is created (django-stubs do not know it).
            "last_seq": lambda: StreamEvent.objects.filter(stream_id=stream_id).aggregate(m=Max("seq"))["m"] or 0,
        },  # type: ignore[misc]
    )
    return cursor


def _append(*, session_id: str, stream_id: str, data: str) -> StreamEvent | None:
    """Store ``data`` as the next event of the stream, numbered under the stream's row lock
    (None: a GET stream never opened, see the module's docstring)."""
    with transaction.atomic():
        if is_get_stream(stream_id):
            cursor = StreamCursor.objects.select_for_update().filter(pk=stream_id).first()
            if cursor is None:
                return None
        else:
            cursor = _locked_cursor(session_id=session_id, stream_id=stream_id)
        cursor.last_seq += 1
        cursor.save(update_fields=["last_seq", "updated_at"])
        event = StreamEvent.objects.create(session_id=session_id, stream_id=stream_id, seq=cursor.last_seq, data=data)
        cap = conf.get().STREAM_MAX_EVENTS
        if cap > 0 and cursor.last_seq > cap:
            # Keep the newest ``cap`` events (one indexed DELETE, under the stream's row lock):
            # however much a tool sends, its stream never holds more.
            StreamEvent.objects.filter(stream_id=stream_id, seq__lte=cursor.last_seq - cap).delete()
        return event


def publish(*, session_id: str, stream_id: str, message: dict[str, Any]) -> str | None:
    """Store ``message`` as the next event of ``stream_id`` and push it to its connection.

    Returns the SSE event id (None: a GET stream never opened, which gets nothing).
    Synchronous (database write); call from a thread in async code. The push happens after
    commit, so a connection that sees a gap can always read it back.
    """
    data = encode(message)
    event = _append(session_id=session_id, stream_id=stream_id, data=data)
    if event is None:
        return None
    group, push = push_of(stream_id=stream_id, seq=event.seq, data=data)
    transaction.on_commit(lambda: send(group, push))
    return event.event_id


def encode(message: dict[str, Any]) -> str:
    """A message as a stored event's ``data`` (compact JSON)."""
    return json.dumps(message, separators=(",", ":"))


def push_of(*, stream_id: str, seq: int, data: str) -> tuple[str, dict[str, Any]]:
    """The channel-layer message that hands a stored event to its stream's connection, and its group."""
    return stream_group(stream_id), {"type": "stream.event", "event_id": f"{stream_id}.{seq}", "seq": seq,
                                     "data": data}


def one_statement_publish_sql(*, notes: str, now: str, cap: str) -> str:
    """CTEs storing events inside a larger PostgreSQL statement: :func:`publish_many`'s work.

    ``notes`` names a CTE of the statement with the columns ``ord`` (order within a stream),
    ``session_id``, ``stream`` and ``data`` (the JSON text); ``now`` and ``cap`` are the placeholders
    of the time and ``MCPTASKS_STREAM_MAX_EVENTS``. The streams' cursors are locked in key order
    and advanced once per stream; the events take the numbers after them in ``ord`` order, and
    each stream keeps its newest ``cap`` events. A stream without a cursor row gets nothing here:
    the CTE ``pub_advanced`` lacks it, and the caller publishes those notes with
    :func:`publish_many` (a stream's first event is rare). ``pub_stored`` returns each stored
    event's ``stream_id``, ``seq`` and ``data``. The CTEs end without a comma.
    """
    from django.db import connection

    q = connection.ops.quote_name
    cursors, events = q(StreamCursor._meta.db_table), q(StreamEvent._meta.db_table)
    # Identifiers come from the models' metadata; the caller binds every value.
    return (
        f"pub_counts AS (SELECT stream, count(*) AS n FROM {notes} GROUP BY stream), "  # noqa: S608
        f"pub_locked AS MATERIALIZED (SELECT c.stream_id FROM {cursors} c "
        "WHERE c.stream_id IN (SELECT stream FROM pub_counts) ORDER BY c.stream_id FOR NO KEY UPDATE), "
        f"pub_advanced AS (UPDATE {cursors} c SET last_seq = c.last_seq + pc.n, updated_at = {now} "
        "FROM pub_counts pc WHERE c.stream_id = pc.stream AND c.stream_id IN (SELECT stream_id FROM pub_locked) "
        "RETURNING c.stream_id, c.last_seq AS last, pc.n), "
        f"pub_stored AS (INSERT INTO {events} (session_id, stream_id, seq, data, created_at) "
        "SELECT n.session_id, n.stream, a.last - a.n + row_number() OVER (PARTITION BY n.stream ORDER BY n.ord), "
        f"n.data, {now} FROM {notes} n JOIN pub_advanced a ON a.stream_id = n.stream "
        "RETURNING stream_id, seq, data), "
        f"pub_trimmed AS (DELETE FROM {events} e USING pub_advanced a WHERE CAST({cap} AS INTEGER) > 0 "
        f"AND e.stream_id = a.stream_id AND e.seq <= a.last - CAST({cap} AS INTEGER))"
    )


def publish_many(
    items: Sequence[tuple[str, str, dict[str, Any]]], *, signals: Sequence[tuple[str, dict[str, Any]]] = ()
) -> list[str]:
    """:func:`publish` for many ``(session_id, stream_id, message)`` at once; the event ids of
    those stored (none for a GET stream never opened).

    One transaction stores them all: the streams' cursors are locked in key order (concurrent
    publishers never deadlock), advanced by one UPDATE, and the events written by one INSERT.
    Events of one stream keep the order of ``items``. After commit, the pushes and then
    ``signals`` (``(group, message)`` pairs, e.g. task signals) are sent in one hop to the event
    loop, a few at a time, instead of a blocking round trip per message.
    """
    if not items:
        send_many([], list(signals))
        return []
    sessions: dict[str, str] = {}
    for session_id, stream_id, _m in items:
        sessions.setdefault(stream_id, session_id)
    streams = sorted(sessions)
    cap = conf.get().STREAM_MAX_EVENTS
    with transaction.atomic():
        seqs = dict(
            StreamCursor.objects.select_for_update().filter(stream_id__in=streams).order_by("stream_id")
            .values_list("stream_id", "last_seq")
        )
        unopened = {s for s in streams if s not in seqs and is_get_stream(s)}
        if unopened:
            items = [item for item in items if item[1] not in unopened]
            streams = [s for s in streams if s not in unopened]
            if not items:
                transaction.on_commit(lambda: send_many([], list(signals)))
                return []
        datas = [encode(message) for _s, _st, message in items]
        for stream_id in (s for s in streams if s not in seqs):
            # Rare (a stream's first event, or its cursor removed by cleanup): created as one
            # event's publish creates it, still locked.
            seqs[stream_id] = _locked_cursor(session_id=sessions[stream_id], stream_id=stream_id).last_seq
        events: list[StreamEvent] = []
        ids: list[str] = []
        for (session_id, stream_id, _m), data in zip(items, datas, strict=True):
            seqs[stream_id] += 1
            events.append(StreamEvent(session_id=session_id, stream_id=stream_id, seq=seqs[stream_id], data=data))
            ids.append(f"{stream_id}.{seqs[stream_id]}")
        StreamCursor.objects.filter(stream_id__in=streams).update(
            last_seq=Case(*[When(stream_id=s, then=Value(seqs[s])) for s in streams]), updated_at=timezone.now()
        )
        StreamEvent.objects.bulk_create(events)
        over = [s for s in streams if cap > 0 and seqs[s] > cap]
        if over:
            # As _append: keep the newest ``cap`` events of each stream (one DELETE).
            drop = Q()
            for s in over:
                drop |= Q(stream_id=s, seq__lte=seqs[s] - cap)
            StreamEvent.objects.filter(drop).delete()
        pushes = [
            push_of(stream_id=stream_id, seq=int(event_id.rpartition(".")[2]), data=data)
            for (_s, stream_id, _m), data, event_id in zip(items, datas, ids, strict=True)
        ]
        transaction.on_commit(lambda: send_many(pushes, list(signals)))
    return ids


def open_get_stream(*, session_id: str) -> int:
    """Open the session's GET stream for good (its cursor row: from now on its messages are
    stored) and return the sequence number of its newest event, where a fresh GET starts."""
    stream_id = get_stream_id(session_id)
    cursor = StreamCursor.objects.filter(pk=stream_id).values_list("last_seq", flat=True).first()
    if cursor is not None:
        return int(cursor)
    with transaction.atomic():
        return _locked_cursor(session_id=session_id, stream_id=stream_id).last_seq


def bind_stream(*, session_id: str, stream_id: str, task_id: str, rpc_id: str | int | None) -> None:
    """Record on the stream's cursor row that it answers ``tasks/result`` ``rpc_id`` for ``task_id``."""
    StreamCursor.objects.update_or_create(
        stream_id=stream_id, defaults={"session_id": session_id, "task_id": task_id, "rpc_id": rpc_id}
    )


def stream_binding(*, session_id: str, stream_id: str) -> dict[str, Any] | None:
    """``{"taskId", "rid"}`` of a tasks/result stream of ``session_id``, or None."""
    row = StreamCursor.objects.filter(stream_id=stream_id, session_id=session_id).values("task_id", "rpc_id").first()
    if row is None or not row["task_id"]:
        return None
    return {"taskId": row["task_id"], "rid": row["rpc_id"]}
