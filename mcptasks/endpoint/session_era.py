"""The session-based side of the one MCP endpoint (2025-11-25 and earlier): a parsed POST.

The consumer reads and parses the body; what the message then means is decided here: the
session it names (``Mcp-Session-Id``), a client notification, a client's answer to a server
request, or a request, which passes the one admission pipeline both eras run
(:mod:`mcptasks.endpoint.admission`) and is dispatched. Nothing here writes to the connection:
each function returns what the consumer is to send (:mod:`mcptasks.endpoint.replies`), or the
:class:`~mcptasks.methods.era2025.StreamReply` of a handler that opened a stream.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from pydantic import ValidationError

from mcptasks import observability
from mcptasks.endpoint import admission
from mcptasks.endpoint.errors import PASSTHROUGH, UNAVAILABLE
from mcptasks.endpoint.gate import Gate, HttpError
from mcptasks.endpoint.replies import JsonReply, Reply
from mcptasks.methods.era2025 import OpenStream, RequestContext, StreamReply, dispatcher
from mcptasks.protocol import jsonrpc, versions
from mcptasks.protocol.messages import CLIENT_NOTIFICATIONS, TASK_ID_PATTERN, CancelledNotificationParams
from mcptasks.tasks import messages, selectors, session_memory, sessions, transitions
from tenants.auth import AuthContext

logger = logging.getLogger(__name__)

_TASK_ID = re.compile(TASK_ID_PATTERN)

#: What the handlers raise that is answered here: the error table's, and a session found gone
#: by the write of a request that used it unread (404, as for a session never found).
_PASSTHROUGH = (*PASSTHROUGH, session_memory.SessionGone)


def creates_task(msg: Any) -> bool:
    """Whether ``msg`` is a task-augmented ``tools/call`` (its params name a ``task``)."""
    return (isinstance(msg, jsonrpc.JSONRPCRequest) and msg.method == "tools/call" and isinstance(msg.params, dict)
            and isinstance(msg.params.get("task"), dict))


def read_task_id(msg: Any) -> str | None:
    """The task id of a well-formed ``tasks/get``/``tasks/result`` request, else None."""
    if not isinstance(msg, jsonrpc.JSONRPCRequest) or msg.method not in ("tasks/get", "tasks/result"):
        return None
    task_id = msg.params.get("taskId") if isinstance(msg.params, dict) else None
    return task_id if isinstance(task_id, str) and _TASK_ID.fullmatch(task_id) else None


async def load_session(
    gate: Gate, *, auth: AuthContext, required: bool = True, task_id: str | None = None, status_only: bool = False,
    creates: bool = False,
) -> tuple[Any, selectors.SessionAndTask | None]:
    """The request's session (400 without the header, 404 if it is not the caller's live one),
    and the task it names when read in the same round trip.

    ``task_id``: the request reads that task (``tasks/get``, ``tasks/result``); it is read with
    the session where possible and kept for the handler (``RequestContext.prefetched``).
    ``creates``: the request creates a task (:func:`creates_task`); a session this process read
    live before may then be used unread (:func:`mcptasks.tasks.session_memory.remembered_session`).
    """
    sid = gate.header("mcp-session-id")
    if not sid:
        if required:
            raise HttpError(400, "Bad Request: Mcp-Session-Id header is required")
        return None, None
    if creates:
        # A task creation's statement checks its session is live when it writes: the session
        # this process last read live is enough to go on with (one round trip, not two).
        remembered = session_memory.remembered_session(session_id=sid, auth=auth)
        if remembered is not None and not sessions.session_needs_touch(session=remembered):
            return remembered, None
    both = None
    if task_id is not None:
        both = await selectors.aget_session_and_task(
            session_id=sid, auth=auth, task_id=task_id, status_only=status_only
        )
    session = both.session if both is not None else await selectors.aget_session(session_id=sid, auth=auth)
    if session is None:
        session_memory.forget_session(sid)
        raise HttpError(404, "Session not found")
    if sessions.session_needs_touch(session=session):
        await database_sync_to_async(sessions.touch_session)(session=session)
    if creates:
        session_memory.remember_session(session)  # for its next creation (only creations use it)
    return session, both


async def handle(
    msg: jsonrpc.Message, *, gate: Gate, auth: AuthContext, open_stream: Callable[..., Awaitable[str]],
) -> Reply | StreamReply:
    """What to answer a parsed session-based POST (``open_stream(session, prefix)`` opens its SSE response)."""
    session, prefetched = None, None
    if not (isinstance(msg, jsonrpc.JSONRPCRequest) and msg.method == "initialize"):
        # Everything but initialize (which always opens a new session) needs the session
        # initialize opened (spec: 400 without the header).
        status_only = isinstance(msg, jsonrpc.JSONRPCRequest) and msg.method == "tasks/get"
        session, prefetched = await load_session(gate, auth=auth, task_id=read_task_id(msg), status_only=status_only,
                                                 creates=creates_task(msg))
    if isinstance(msg, jsonrpc.JSONRPCNotification):
        await notify(session, msg)
        return JsonReply(202)
    if isinstance(msg, jsonrpc.JSONRPCResponse | jsonrpc.JSONRPCError):
        await answer_server_request(auth, msg)
        return JsonReply(202)

    async def open_for_session(prefix: str, *, before_priming: Callable[[str], Awaitable[None]] | None = None) -> str:
        return await open_stream(session, prefix, before_priming=before_priming)

    return await serve(
        msg, auth=auth, session=session, prefetched=prefetched, resource_url=gate.resource_url,
        open_stream=open_for_session,
    )


async def notify(session: Any, msg: jsonrpc.JSONRPCNotification) -> None:
    """A client notification on ``session`` (None: none was named): act on those that matter."""
    if session is None:
        return
    model = CLIENT_NOTIFICATIONS.get(msg.method)
    if model is None:
        return  # roots/list_changed, progress, ...: nothing to do here
    try:
        params = model.model_validate(msg.params or {})
    except ValidationError:
        # A notification gets no answer; a malformed one is dropped (and said so in the log).
        logger.info("malformed %s notification ignored", msg.method)
        return
    if isinstance(params, CancelledNotificationParams):
        await database_sync_to_async(transitions.cancel_request)(session=session, request_id=params.requestId)
    elif msg.method == "notifications/initialized":
        await database_sync_to_async(sessions.mark_initialized)(session=session)


async def answer_server_request(auth: AuthContext, msg: jsonrpc.JSONRPCResponse | jsonrpc.JSONRPCError) -> None:
    """The client answered a server request of a task (400 when none pending has that id)."""
    if not isinstance(msg.id, str):
        raise HttpError(400, "Bad Request: no pending server request has that id")
    payload = msg.model_dump(mode="json", exclude_none=True)
    ok = await database_sync_to_async(messages.answer_task_message)(auth=auth, rpc_id=msg.id, response=payload)
    if not ok:
        raise HttpError(400, "Bad Request: no pending server request has that id")


async def serve(
    msg: jsonrpc.JSONRPCRequest, *, auth: AuthContext, session: Any, prefetched: selectors.SessionAndTask | None,
    resource_url: Callable[[], str], open_stream: OpenStream,
) -> Reply | StreamReply:
    """Admit and dispatch one request; what to send (an error reply while a stream is open is
    that stream's last event), or the stream the handler opened through ``open_stream``."""
    rid = msg.id
    # Clipped here too: the plain log format writes messages as they are.
    logger.debug("request %.100s id=%.100r", msg.method, rid)
    version = session.protocol_version if session is not None else versions.LATEST
    ctx = RequestContext(
        auth=auth, session=session, protocol_version=version, request_id=rid, open_stream=open_stream,
        prefetched=prefetched,
    )
    # The one admission pipeline both eras run: initialized rule, scope, rate limits, fast polls.
    admitted = await admission.admit(
        table=dispatcher, ctx=ctx, auth=auth, method=msg.method, params=msg.params, request_id=rid,
        resource_url=resource_url, initialized=session is None or session.initialized,
    )
    if isinstance(admitted, JsonReply):
        return admitted
    try:
        known = admitted.route is not None
        with observability.rpc_span(msg.method, msg.params, auth=auth, known=known) as span:
            result = await dispatcher.dispatch(ctx, msg.method, msg.params, passthrough=_PASSTHROUGH)
            observability.note_task(span, result)
    except session_memory.SessionGone:
        session_memory.forget_session(session.pk)
        raise HttpError(404, "Session not found") from None
    except UNAVAILABLE:
        raise  # answered (503) where every database outage is
    except Exception as exc:
        answered = await admission.failure(exc, auth=auth, method=msg.method)
        if answered is None:
            raise
        error, status, headers = answered
        return JsonReply(status, jsonrpc.error_response(rid, error), headers)
    if isinstance(result, StreamReply):
        return result
    extra: dict[str, str] = {}
    if ctx.new_session is not None:
        extra["Mcp-Session-Id"] = ctx.new_session.pk
    return JsonReply(200, jsonrpc.response(rid, result), extra)
