"""GET on the endpoint: the session's own stream, or a stream resumed with ``Last-Event-ID``.

One live connection per GET stream: a newer one takes the older over (never a broadcast).
Either way the stream joins its groups before it reads the store, so an event published
meanwhile arrives twice at most and is dropped by sequence: nothing is lost.
"""

from __future__ import annotations

import json
from typing import Any

from channels.db import database_sync_to_async

from mcptasks import conf
from mcptasks.endpoint import result_waiter, session_era
from mcptasks.endpoint.gate import Gate, HttpError
from mcptasks.endpoint.stream_session import StreamSession
from mcptasks.streams import events, signals
from mcptasks.tasks import selectors
from tenants.auth import AuthContext


def _hold_slot(stream: StreamSession, session: Any, stream_id: str) -> None:
    """Count the stream against its principal's limit (429 past it; see mcptasks.endpoint.limits)."""
    if not stream.hold_slot((session.tenant_id, session.principal_id), stream_id):
        limit = conf.get().MAX_STREAMS_PER_PRINCIPAL
        raise HttpError(
            429,
            f"Too many open streams: at most {limit} GET streams per principal on this server; "
            "close one (or end its session with DELETE) and retry",
            headers={"Retry-After": "5"},
        )


async def _take_over(stream: StreamSession, stream_id: str) -> None:
    await signals.group_send(signals.stream_group(stream_id),
                             {"type": "stream.takeover", "token": stream.takeover_token})


async def serve(stream: StreamSession, *, gate: Gate, auth: AuthContext) -> None:
    """A GET: the session's stream (406 without ``text/event-stream`` in ``Accept``), or a resume."""
    gate.check_accept("text/event-stream")
    session, _ = await session_era.load_session(gate, auth=auth)
    last_event_id = gate.header("last-event-id")
    if last_event_id:
        await resume(stream, session=session, auth=auth, last_event_id=last_event_id)
    else:
        await open_get(stream, session=session)


async def open_get(stream: StreamSession, *, session: Any) -> None:
    """The session's GET stream from its current end on (``session``: the caller's, checked)."""
    stream.kind = "get"
    stream.stream_id = stream_id = events.get_stream_id(session.pk)
    _hold_slot(stream, session, stream_id)
    await _take_over(stream, stream_id)
    # A fresh GET starts at the stream's current end (opening the stream for good: from now on
    # its messages are stored, see mcptasks.streams.events). Read it before joining, then replay
    # whatever was stored in between: nothing published meanwhile is lost.
    floor = await database_sync_to_async(events.open_get_stream)(session_id=session.pk)
    stream.next_seq = floor + 1
    await stream.join(signals.stream_group(stream_id))
    await stream.join(signals.session_group(session.pk))
    await stream.start(priming_id=events.priming_id(stream_id, floor))
    await stream.replay(await stream.stored_events(floor))


async def resume(stream: StreamSession, *, session: Any, auth: AuthContext, last_event_id: str) -> None:
    """Resume a stream of ``session`` after ``last_event_id`` (400 malformed, 404 not the session's)."""
    parsed = events.parse_event_id(last_event_id)
    if parsed is None:
        raise HttpError(400, "Bad Request: malformed Last-Event-ID")
    stream_id, seq = parsed
    binding = await database_sync_to_async(events.stream_binding)(session_id=session.pk, stream_id=stream_id)
    owned = binding is not None or stream_id == events.get_stream_id(session.pk) or await database_sync_to_async(
        selectors.stream_of_session
    )(session_id=session.pk, stream_id=stream_id)
    if not owned:
        raise HttpError(404, "Unknown stream for Last-Event-ID")
    _hold_slot(stream, session, stream_id)
    stream.stream_id = stream_id
    stream.kind = "get" if stream_id.startswith("g") else "resume"
    if stream.kind == "get":
        await _take_over(stream, stream_id)
    # Join first, then replay: anything published meanwhile is deduplicated by sequence.
    await stream.join(signals.stream_group(stream_id))
    await stream.join(signals.session_group(session.pk))
    await stream.start(priming_id=events.priming_id(stream_id, seq))
    stream.next_seq = seq + 1
    stored = await stream.stored_events(0 if stream_id.startswith("r") else seq)
    marker: dict[str, Any] | None = binding
    for ev in stored:
        # Requests already sent on this stream (seen, or about to be replayed) are not
        # queued on it a second time.
        payload = json.loads(ev.data)
        if "_bind" in payload:
            marker = marker or payload["_bind"]  # streams bound before the cursor columns
        elif "method" in payload and "id" in payload:
            stream.sent_rpc_ids.add(str(payload["id"]))
    await stream.replay([ev for ev in stored if ev.seq > seq])
    if not stream.closed and marker is not None:
        await result_waiter.resume(stream, auth=auth, session_id=session.pk, marker=marker)
