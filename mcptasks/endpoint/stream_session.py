"""One open SSE response of the endpoint, and what keeps it whole.

A stream is fed by stored events (every event is stored before it is pushed), pushed to it
through the channel layer. The channel layer is an accelerator, not a dependency: when it fails,
the stream re-reads the store every ``LAYER_FALLBACK_POLL_S`` and rejoins its groups once Redis
answers again. Sequence numbers are gap-free per stream, so an event that arrives early reveals
the ones still in flight, which are read back from the store: nothing is skipped, nothing is
sent twice. A stream also sends keep-alives, bounds its connection's lifetime (the client
resumes with ``Last-Event-ID``) and hands a GET stream over to a newer connection (takeover).

What a stream serves besides its stored events (a blocking ``tasks/result``, a 2026-07-28
``subscriptions/listen``) is its :class:`Follower`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer

from mcptasks import conf
from mcptasks.endpoint import limits
from mcptasks.observability import metrics
from mcptasks.protocol import jsonrpc, sse
from mcptasks.streams import events, membership, signals
from mcptasks.tasks import selectors

logger = logging.getLogger(__name__)

#: Streams open in this process (closed with ``retry:`` on shutdown).
_LIVE_STREAMS: weakref.WeakSet[StreamSession] = weakref.WeakSet()
metrics.count_objects("streams", lambda: len(_LIVE_STREAMS))

#: Kinds of stream that end with the response they carry (a GET stream and a listen do not).
_ENDS_WITH_RESPONSE = frozenset({"request", "task_result", "resume"})


async def close_all_streams() -> int:
    """Server shutdown: end every open SSE response of this process with a ``retry:`` hint.

    Clients reconnect (with ``Last-Event-ID``) to another process and lose nothing: every
    event is stored before it is sent. Returns how many streams were closed.
    """
    closed = 0
    for stream in list(_LIVE_STREAMS):
        if stream.closed:
            continue
        try:
            await stream.close(hint_retry=True)  # a listen ends with its SubscriptionsListenResult
            closed += 1
        except Exception:
            logger.debug("closing a stream at shutdown failed", exc_info=True)
    return closed


class Wire(Protocol):
    """The HTTP response a stream writes to (the consumer's)."""

    async def send_headers(self, *, status: int = ..., headers: Iterable[tuple[bytes, bytes]] | None = ...) -> None:
        """Start the response."""

    async def send_body(self, body: bytes, *, more_body: bool = ...) -> None:
        """Write part of the body (``more_body=False``: the last part)."""


class Follower(Protocol):
    """What a stream serves besides its stored events (a tasks/result waiter, a listen)."""

    async def on_message(self, message: dict[str, Any]) -> None:
        """A ``task.signal`` (a watched task changed, or the periodic re-check), or a message the
        follower queued for itself (:meth:`StreamSession.send_self`)."""

    async def catch_up(self) -> None:
        """Re-read the store: wake-ups may have been lost while the layer failed."""

    def farewell(self) -> bytes | None:
        """The last frame when the server ends the stream (None: a bare ``retry:``)."""

    async def end(self) -> None:
        """The connection is gone: release what the follower holds."""


class StreamSession:
    """One open SSE response: its groups, its position in the stream, its background work."""

    def __init__(self, wire: Wire, layer: Any, *, cors_headers: list[tuple[bytes, bytes]]) -> None:
        self.wire = wire
        self.cors_headers = cors_headers
        #: request | get | resume | task_result | listen: when the stream ends by itself.
        self.kind = ""
        self.stream_id: str | None = None
        #: The next sequence number of our stream to write.
        self.next_seq = 1
        #: Server requests already sent on this stream (never queued on it twice).
        self.sent_rpc_ids: set[str] = set()
        self.started = False  # SSE headers sent
        self.closed = False
        self.follower: Follower | None = None
        #: Our channel-layer groups; while the layer fails we poll the store and try to rejoin them.
        self.groups = membership.Memberships(
            layer, tick=lambda: self.send_self({"type": "layer.poll"}), alive=lambda: not self.closed
        )
        self.background: list[asyncio.Task[Any]] = []
        self._slot: tuple[limits.Owner, str] | None = None

    @functools.cached_property
    def takeover_token(self) -> str:
        """Names this stream's holder in a takeover (a resumed stream closes the previous one)."""
        return secrets.token_hex(8)

    @functools.cached_property
    def local(self) -> asyncio.Queue[dict[str, Any]]:
        """Messages to ourselves (re-checks, the scheduled close, fallback polls): a local queue,
        never the channel layer, so they work whatever state Redis is in."""
        return asyncio.Queue()

    def hold_slot(self, owner: limits.Owner, stream_id: str) -> bool:
        """Count this stream against its principal's open-stream limit; False past it."""
        if not limits.streams.acquire(owner, stream_id, limit=conf.get().MAX_STREAMS_PER_PRINCIPAL):
            return False
        self._slot = (owner, stream_id)
        return True

    # --- channel-layer membership ------------------------------------------------------------------

    async def join(self, group: str) -> None:
        """Join ``group``; if the layer fails, the stream falls back to the store (and rejoins)."""
        await self.groups.join(group)

    async def layer_poll(self) -> None:
        """Fallback tick: rejoin our groups if Redis answers again, and catch up from the store."""
        if await self.groups.rejoin():
            logger.info("stream %s rejoined its channel-layer groups", self.stream_id)
        await self.catch_up()

    # --- the response ----------------------------------------------------------------------------------

    async def open(self, prefix: str, *, session_id: str | None,
                   before_priming: Callable[[str], Awaitable[None]] | None = None) -> str:
        """Open a new stream for a request (of session ``session_id``, if any); its id.

        ``before_priming(stream_id)`` runs before the priming event (whose id the client may
        resume with at once) is sent.
        """
        self.stream_id = stream_id = events.new_stream_id(prefix)
        await self.join(signals.stream_group(stream_id))
        if session_id is not None:
            await self.join(signals.session_group(session_id))
        if before_priming is not None:
            await before_priming(stream_id)
        await self.start(priming_id=events.priming_id(stream_id, 0))
        return stream_id

    async def start(self, *, priming_id: str | None) -> None:
        """Send the SSE headers and the priming event; start the keep-alives."""
        await self.wire.send_headers(status=200, headers=[*sse.HEADERS, *self.cors_headers])
        self.started = True
        _LIVE_STREAMS.add(self)
        self.groups.listen()
        if priming_id is not None:  # a listen is not resumable: no event ids, no priming event
            await self.send(sse.event("", event_id=priming_id, retry_ms=conf.get().SSE_RETRY_MS))
        self.background.append(asyncio.ensure_future(self._keepalive()))

    async def send(self, frame: bytes) -> None:
        """Write one frame; the response stays open."""
        await self.wire.send_body(frame, more_body=True)

    async def send_last(self, message: dict[str, Any]) -> None:
        """Write ``message`` (a response) as the stream's last event, then end it."""
        await self.send(sse.event(jsonrpc.encode(message)))
        await self.close()

    def send_self(self, message: dict[str, Any]) -> None:
        """Queue ``message`` for our own dispatch (never through the channel layer)."""
        self.local.put_nowait(message)

    async def _keepalive(self) -> None:
        settings_ = conf.get()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings_.SSE_MAX_STREAM_S
        try:
            while not self.closed:
                await asyncio.sleep(settings_.SSE_KEEPALIVE_S)
                if self.closed:
                    return
                if loop.time() >= deadline:
                    # Bound connection lifetime: hint the client to come back, then close the
                    # connection (not the stream); it resumes with Last-Event-ID. Through our
                    # local queue, so it happens whatever state the channel layer is in.
                    self.send_self({"type": "stream.close_connection"})
                    return
                await self.send(sse.comment())
        except asyncio.CancelledError:
            pass

    async def recheck_loop(self) -> None:
        """Backstop for lost wake-ups: a periodic re-read, not a tight poll loop."""
        try:
            while not self.closed:
                await asyncio.sleep(conf.get().TASK_RESULT_RECHECK_S)
                self.send_self({"type": "task.signal", "event": "recheck"})
        except asyncio.CancelledError:
            pass

    async def close(self, *, hint_retry: bool = False) -> None:
        """End the response (``hint_retry``: the server ends it; the client is to come back)."""
        if self.closed:
            return
        self.closed = True
        farewell = self.follower.farewell() if hint_retry and self.follower is not None else None
        if farewell is not None:
            # A listen ends with its SubscriptionsListenResult: the client listens again.
            await self.send(farewell)
        elif hint_retry:
            await self.send(sse.retry(conf.get().SSE_RETRY_MS))
        await self.wire.send_body(b"", more_body=False)

    # --- stored events ---------------------------------------------------------------------------------

    async def stored_events(self, after: int) -> list[Any]:
        """Our stream's stored events past sequence number ``after``."""
        assert self.stream_id is not None
        return await database_sync_to_async(selectors.stream_events_after)(stream_id=self.stream_id, after=after)

    async def replay(self, events: list[Any]) -> None:
        """Write stored events in order, from our position on (earlier ones were sent)."""
        for ev in events:
            if self.closed:
                break
            if ev.seq < self.next_seq:
                continue
            self.next_seq = ev.seq + 1
            await self._emit(ev.event_id, ev.data)

    async def replay_stored(self) -> None:
        """Write the stored events past our position that the channel layer has not brought us."""
        if self.closed or self.stream_id is None or not self.started:
            return
        await self.replay(await self.stored_events(self.next_seq - 1))

    async def catch_up(self) -> None:
        """Write whatever the store has past our position (and let the follower re-check)."""
        if self.closed or self.stream_id is None or not self.started:
            return
        if self.follower is not None:
            await self.follower.catch_up()
        else:
            await self.replay_stored()

    async def _emit(self, event_id: str, data: str) -> None:
        payload = json.loads(data)
        if payload.get("_bind"):
            return  # bookkeeping of a tasks/result stream, never sent
        if payload.get("_close"):
            # The tool asked to close the connection (not the stream): the client resumes.
            # A resumed connection has already been through that point, so it stays open.
            if self.kind == "request":
                await self.close(hint_retry=True)
            return
        if payload.get("_end"):
            await self.close()
            return
        await self.send(sse.event(data, event_id=event_id))
        is_response = "method" not in payload and ("result" in payload or "error" in payload)
        if is_response and self.kind in _ENDS_WITH_RESPONSE:
            await self.close()

    # --- messages to the stream ------------------------------------------------------------------------

    async def handle(self, message: dict[str, Any]) -> None:
        """A message from the channel layer or our local queue; StopConsumer once the stream ended."""
        kind = message["type"]
        if kind == "stream.event":
            await self._on_event(message)
        elif kind == "stream.takeover":
            if message.get("token") != self.takeover_token:
                # A newer connection took over this GET stream: hand it over and close.
                await self.close(hint_retry=True)
        elif kind == "stream.close_connection":
            await self.close(hint_retry=True)  # the stream's lifetime bound
        elif kind == "session.signal":
            if message.get("event") == "ended":
                await self.close()  # the session was deleted: its streams end
        elif kind == "layer.poll":
            if not self.closed:
                await self.layer_poll()
        elif self.follower is not None:
            await self.follower.on_message(message)
        elif kind != "task.signal":  # a signal with nobody to follow it is dropped
            raise ValueError(f"No handler for message type {kind}")
        if self.closed:
            raise StopConsumer()

    async def _on_event(self, message: dict[str, Any]) -> None:
        """A stored event of our stream arrived through the channel layer."""
        seq = int(message["seq"])
        if seq < self.next_seq or self.closed or self.stream_id is None:
            return
        if seq > self.next_seq:
            # Published by another process and still in flight to us: take them from the store.
            await self.replay(await self.stored_events(self.next_seq - 1))
        if seq == self.next_seq and not self.closed:
            self.next_seq = seq + 1
            await self._emit(message["event_id"], message["data"])

    # --- the end ---------------------------------------------------------------------------------------

    async def disconnect(self) -> None:
        """The client went away: leave our groups, stop background work, let the follower release."""
        for t in self.background:
            t.cancel()
        await self.groups.leave()
        if self.follower is not None:
            await self.follower.end()

    def end(self) -> None:
        """However the consumer ends (finished, disconnected, cancelled): nothing outlives it."""
        self.closed = True
        for t in self.background:
            t.cancel()
        # Messages still addressed to this channel (a notification on its way, a group whose
        # discard failed) are dropped instead of buffered for ever.
        self.groups.end()
        if self._slot is not None:
            limits.streams.release(*self._slot)
            self._slot = None
