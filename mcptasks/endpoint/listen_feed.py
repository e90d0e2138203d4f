"""A 2026-07-28 ``subscriptions/listen`` served on an open stream: acknowledge, then changes.

Wake-ups are the ``task.signal`` of each watched task's group (what ``tasks/result`` streams
use); the periodic re-check and, while Redis fails, the fallback poll re-read the store. A
listen has no stored events and is not resumable: the client listens again after a drop, and
the current state it is sent first means it misses no terminal state. A listen counts against
the principal's open-stream limit like a GET stream.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mcptasks import conf
from mcptasks.endpoint.replies import JsonReply
from mcptasks.endpoint.stream_session import StreamSession
from mcptasks.methods.listen import Listen
from mcptasks.protocol import jsonrpc
from mcptasks.protocol.errors import INVALID_REQUEST, McpError
from mcptasks.streams import events, signals
from tenants.auth import AuthContext


async def open_listen(stream: StreamSession, listen: Listen, *, auth: AuthContext) -> JsonReply | None:
    """Serve ``listen`` on ``stream``; the 429 to send instead when the principal is at its limit."""
    stream_id = events.new_stream_id("l")
    if not stream.hold_slot((auth.tenant_id, auth.principal_id), stream_id):
        limit = conf.get().MAX_STREAMS_PER_PRINCIPAL
        error = McpError(INVALID_REQUEST, f"Too many open streams: at most {limit} streams per principal "
                                          "on this server; close one and retry")
        return JsonReply(429, jsonrpc.error_response(listen.request_id, error), {"Retry-After": "5"})
    stream.stream_id = stream_id
    stream.kind = "listen"
    feed = ListenFeed(stream, listen)
    stream.follower = feed
    # Join before the first read: a change made meanwhile is read again, never missed.
    for task_id in listen.task_ids:
        await stream.join(signals.task_group(task_id))
    await stream.start(priming_id=None)
    await stream.send(listen.acknowledgement())
    # The current state once, right after the acknowledgement: a client that listens again
    # after a drop misses no terminal state.
    await feed.check(None)
    if listen.task_ids and not stream.closed:
        stream.background.append(asyncio.ensure_future(stream.recheck_loop()))
    return None


class ListenFeed:
    """The listen a stream serves (its :class:`~mcptasks.endpoint.stream_session.Follower`)."""

    def __init__(self, stream: StreamSession, listen: Listen) -> None:
        self.stream = stream
        self.listen = listen
        # Wake-ups not read yet (task ids; ``_all``: every watched task), and the one coroutine
        # reading them: wake-ups arriving during a read share the next.
        self._due: set[str] = set()
        self._all = False
        self._reader: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    async def check(self, task_ids: list[str] | None) -> None:
        """Send the changes of ``task_ids`` (None: every watched task) since they were last sent."""
        if self.stream.closed:
            return
        for frame in await self.listen.changes(task_ids):
            if self.stream.closed:
                return
            await self.stream.send(frame)

    async def on_message(self, message: dict[str, Any]) -> None:
        """A watched task changed (or the re-check came); or a read failed (``listen.failed``)."""
        if message["type"] == "listen.failed":
            # Raised here, in the consumer's dispatch, where a database outage ends the listen
            # with its result and anything else ends the connection.
            error, self._error = self._error, None
            if error is not None:
                raise error
        elif message["type"] == "task.signal" and not self.stream.closed:
            task_id = message.get("task_id")
            self.wake([task_id] if isinstance(task_id, str) else None)

    async def catch_up(self) -> None:
        """Re-read every watched task (through the one reader: a stale read is never sent after a newer one)."""
        self.wake(None)

    def farewell(self) -> bytes | None:
        """The server ends the listen: its SubscriptionsListenResult tells the client to listen again."""
        return self.listen.ending()

    async def end(self) -> None:
        """Nothing to release: a listen binds nothing in the store."""

    def wake(self, task_ids: list[str] | None) -> None:
        """Have the listen re-read ``task_ids`` (None: all it watches) as soon as it can.

        Returns at once, so signals that arrive while a read is under way are dispatched
        meanwhile and gathered here: when many watched tasks change together, one read and
        rendering serves them all instead of one round trip each, queued one behind the other.
        """
        if task_ids is None:
            self._all = True
        else:
            self._due.update(task_ids)
        if self._reader is None or self._reader.done():
            self.stream.background = [t for t in self.stream.background if not t.done()]
            self._reader = asyncio.ensure_future(self._read())
            self.stream.background.append(self._reader)

    async def _read(self) -> None:
        """Read and send what :meth:`wake` gathered until nothing is due (one at a time)."""
        try:
            while not self.stream.closed and (self._all or self._due):
                task_ids = None if self._all else list(self._due)
                self._all, self._due = False, set()
                await self.check(task_ids)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Raised again in the consumer's own dispatch (listen.failed), exactly as when the
            # read ran inside the signal's handler.
            self._error = exc
            self.stream.send_self({"type": "listen.failed"})
