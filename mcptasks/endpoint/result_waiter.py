"""The blocking ``tasks/result``: a stream that waits for one task and ends with its result.

While the task runs, the server requests it makes (elicitation, sampling) are delivered on this
stream, and only on the newest ``tasks/result`` stream of the task. Wake-ups are the task's
``task.signal``; a periodic re-check (and, while Redis fails, the fallback poll) re-reads the
store, so a lost wake-up delays the answer, never loses it. The stream is bound to the task and
the request id it answers, so a client that resumes it with ``Last-Event-ID`` still gets the
result (:func:`resume`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.db import database_sync_to_async

from mcptasks.endpoint.stream_session import StreamSession
from mcptasks.protocol import jsonrpc
from mcptasks.protocol.errors import INVALID_PARAMS, TASK_EXPIRED, TASK_NOT_FOUND, McpError
from mcptasks.streams import events, signals
from mcptasks.tasks import auditing, messages, selectors, wire
from tenants.auth import AuthContext


class ResultWaiter:
    """Follows one task on a stream (see the module docstring); the stream's :class:`Follower`."""

    def __init__(self, stream: StreamSession, *, auth: AuthContext, task: Any, request_id: str | int | None) -> None:
        self.stream = stream
        self.auth = auth
        #: The task awaited (a ``Task`` row of the tasks layer), re-read on every check.
        self.task = task
        self.request_id = request_id
        #: A signal and a re-check can both see the terminal state: the result is published once.
        self.published = False

    async def start(self) -> None:
        """Send what is due now, then wait for the task's signals.

        The stream is already bound to the task and request id (by ``tasks/result``'s handler,
        before the priming event: see :mod:`mcptasks.methods.era2025`), or resumed from that binding.
        """
        stream, task = self.stream, self.task
        assert stream.stream_id is not None
        stream.kind = "task_result"
        stream.follower = self
        await stream.join(signals.task_group(task.task_id))
        await database_sync_to_async(messages.bind_result_stream)(auth=self.auth, task=task, stream_id=stream.stream_id)
        await self._check()
        if not stream.closed:
            stream.background.append(asyncio.ensure_future(stream.recheck_loop()))

    async def on_message(self, message: dict[str, Any]) -> None:
        """Something happened to the task (or the periodic re-check came)."""
        if message["type"] != "task.signal" or self.stream.closed:
            return
        if message.get("event") == "recheck":
            # The backstop re-reads the stream too, not only the task: an event stored for us
            # whose push was lost (a send skipped while this process's breaker was open, or
            # timed out) would otherwise wait for the stream's lifetime.
            await self.stream.catch_up()
        else:
            await self._check()

    async def catch_up(self) -> None:
        """Write what the store holds past our position, then re-check the task."""
        await self.stream.replay_stored()
        if not self.stream.closed:
            await self._check()

    def farewell(self) -> bytes | None:
        """A bare ``retry:``: the client resumes the stream and still gets the result."""
        return None

    async def end(self) -> None:
        """Release the task's binding to this stream (never a newer stream's)."""
        stream_id = self.stream.stream_id
        if stream_id:
            await database_sync_to_async(messages.bind_result_stream)(
                auth=self.auth, task=self.task, stream_id=None, only_if=stream_id
            )

    async def _check(self) -> None:
        stream = self.stream
        assert stream.stream_id is not None
        task = await database_sync_to_async(selectors.reread_task)(task=self.task)
        if task is None:
            await stream.send_last(jsonrpc.error_response(self.request_id, McpError(INVALID_PARAMS, TASK_NOT_FOUND)))
            return
        self.task = task
        if not task.is_terminal and selectors.is_expired(task):
            # The ttl ran out while we waited: answer like tasks/get would.
            await stream.send_last(jsonrpc.error_response(self.request_id, McpError(INVALID_PARAMS, TASK_EXPIRED)))
            return
        if not task.is_terminal:
            await self._deliver_requests(task)
            return
        if self.published:
            return
        self.published = True
        await auditing.arecord_task_retrieval(auth=self.auth, task=task)
        result, error = wire.task_result_payload(task=task)
        assert self.request_id is not None
        if error is not None:
            message = jsonrpc.error_response(self.request_id, McpError.from_error(error))
        else:
            message = jsonrpc.response(self.request_id, result or {})
        await database_sync_to_async(events.publish)(
            session_id=task.session_id, stream_id=stream.stream_id, message=message
        )
        # This connection serves the stream: write the result from the store now instead of
        # waiting for its push to come back through the channel layer. A push that is lost (the
        # send skipped while this process's breaker is open, or timed out under load) left the
        # stream silent until its lifetime ended, since ``published`` stops later re-checks;
        # the push, when it arrives, is a duplicate by sequence and dropped.
        await stream.replay_stored()

    async def _deliver_requests(self, task: Any) -> None:
        """Send the task's unanswered server requests, if this is the task's newest stream."""
        stream = self.stream
        # Unbound while we still wait: a resumed stream shares its id with the dropped
        # connection, whose late end unbinds "our" id. Bind again (never over a newer stream:
        # only while none is bound); a tenant-wide reader's stream never binds.
        if task.stream_id is None and await database_sync_to_async(messages.bind_result_stream)(
            auth=self.auth, task=task, stream_id=stream.stream_id, only_if_unbound=True
        ):
            task.stream_id = stream.stream_id
        if task.stream_id != stream.stream_id:
            return  # a newer tasks/result stream of this task receives its messages (never two)
        pending = await database_sync_to_async(selectors.pending_messages)(task=task)
        delivered = False
        for m in pending:
            if m.rpc_id in stream.sent_rpc_ids:
                continue
            stream.sent_rpc_ids.add(m.rpc_id)
            await database_sync_to_async(messages.deliver_task_message)(
                task=task, message=m, stream_id=stream.stream_id
            )
            delivered = True
        if delivered:
            await stream.replay_stored()  # what we stored ourselves never waits for the layer


async def resume(stream: StreamSession, *, auth: AuthContext, session_id: str, marker: dict[str, Any]) -> None:
    """A resumed ``tasks/result`` stream whose response is still due: serve it as before.

    ``marker``: the stream's binding (task id and request id, see ``events.bind_stream``).
    """
    task = await database_sync_to_async(selectors.session_task)(
        session_id=session_id, task_id=str(marker.get("taskId"))
    )
    rid = marker.get("rid")
    if task is None:
        await stream.send_last(jsonrpc.error_response(rid, McpError(INVALID_PARAMS, TASK_NOT_FOUND)))
        return
    await ResultWaiter(stream, auth=auth, task=task, request_id=rid).start()
