"""The MCP endpoint: Streamable HTTP (POST, GET, DELETE; JSON and SSE) as a Channels consumer.

The consumer is thin: it applies the HTTP rules (:mod:`.gate`), authenticates, parses one
JSON-RPC message, hands it to its era (:mod:`.eras` for 2026-07-28, :mod:`.session_era`
otherwise; both run :mod:`.admission`) and writes the reply as JSON or SSE. Anything that
outlives the request (a tool run, a blocking ``tasks/result``, a listen) arrives as stream
events through the channel layer and is served by the request's :mod:`.stream_session`, so the
process that answers need not be the one that did the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch

from mcptasks import conf, observability
from mcptasks.endpoint import eras as era2026_transport
from mcptasks.endpoint import errors, get_stream, listen_feed, session_era
from mcptasks.endpoint.errors import UNAVAILABLE
from mcptasks.endpoint.gate import Gate, HttpError
from mcptasks.endpoint.replies import ListenReply, Reply, SseReply
from mcptasks.endpoint.result_waiter import ResultWaiter
from mcptasks.endpoint.stream_session import StreamSession
from mcptasks.methods.era2025 import StreamReply
from mcptasks.observability import metrics
from mcptasks.protocol import jsonrpc, sse
from mcptasks.protocol.errors import INTERNAL_ERROR, PARSE_ERROR, McpError, payload_too_large
from mcptasks.tasks import sessions
from tenants.auth import AuthContext, AuthError

logger = logging.getLogger(__name__)

_counted_loop: asyncio.AbstractEventLoop | None = None


class McpConsumer(AsyncHttpConsumer):
    """One HTTP request to the MCP endpoint (a POST, a GET stream or a DELETE)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.body_size = 0
        self.preflight_done = False
        self.responded = False  # a complete (non-streaming) response was sent
        self.auth: AuthContext | None = None
        self.gate = Gate({})
        # Made on first use: a plain JSON answer (the hot path) never opens a stream.
        self._stream: StreamSession | None = None

    @property
    def stream(self) -> StreamSession:
        """This request's SSE stream (made on first use, opened by :meth:`StreamSession.start`)."""
        if self._stream is None:
            self._stream = StreamSession(self, self.channel_layer, cors_headers=self.gate.cors_headers)
        return self._stream

    @property
    def streaming(self) -> bool:
        """SSE headers were sent: the consumer lives on after :meth:`handle`."""
        return self._stream is not None and self._stream.started

    # --- ASGI plumbing ------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Channels' consumer loop, with the channel layer as an accelerator, not a dependency.

        Three sources feed :meth:`dispatch`: the HTTP connection, the stream's local queue and
        the channel layer. A failing layer receive (Redis down, frozen, restarted) does not end
        the consumer as it would in Channels (leaving a deaf stream that only sends keep-alives):
        the stream re-reads the database until it has rejoined its groups (see .stream_session).
        """
        global _counted_loop
        self.scope = scope
        self.gate = Gate(scope)
        observability.start_request_log()
        loop = asyncio.get_running_loop()
        if loop is not _counted_loop:  # once per event loop, not per request
            _counted_loop = loop
            metrics.note_loop(loop)
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.base_send = send
        try:
            with contextlib.suppress(StopConsumer):
                # Until a stream opens, only the HTTP connection can send us anything: read it
                # directly. A plain JSON answer (tasks/get, the hot path) then ends here without
                # starting, and cancelling, a waiter per source.
                while not self.streaming:
                    await self.dispatch(await receive())
                stream = self.stream
                sources: list[Any] = [receive, stream.local.get]
                if self.channel_layer is not None:
                    # Messages sent to our channel since we joined a group wait in the layer.
                    sources.append(stream.groups.receive)
                await await_many_dispatch(sources, self.dispatch)
        finally:
            # However the consumer ends (finished, disconnected, cancelled by the server), no
            # timer or fallback poll outlives it, and its stream slot is given back.
            if self._stream is not None:
                self._stream.end()

    async def dispatch(self, message: dict[str, Any]) -> None:
        """HTTP messages here, the rest to the stream; a database outage is a 503 wherever it surfaces."""
        try:
            # Channels would first close stale database connections (a thread hop on every
            # message). Every ORM call goes through database_sync_to_async, which does that in
            # its own thread before and after the call; async reads use their own connection.
            if message["type"].startswith("http."):
                handler = getattr(self, get_handler_name(message), None)
                if handler is None:
                    raise ValueError(f"No handler for message type {message['type']}")
                await handler(message)
            else:
                await self.stream.handle(message)
        except UNAVAILABLE as exc:
            logger.warning("database unavailable: %s", type(exc).__name__)
            await self._unavailable()
            raise StopConsumer() from None

    async def _unavailable(self) -> None:
        if self.streaming:
            await self.stream.close(hint_retry=True)
        elif not self.responded:
            error, status, headers = errors.unavailable()
            await self._send_json(status, jsonrpc.error_response(None, error), headers)

    async def http_request(self, message: dict[str, Any]) -> None:
        """Collect the body, then handle; stay alive if streaming.

        Nothing is buffered before the request has passed the Host/Origin rules and
        authentication, and an oversize body is refused as soon as it is known to be one (by
        ``Content-Length``, or when the streamed body passes the limit), not after reading it.
        """
        chunk = message.get("body", b"")
        if not self.preflight_done:
            self.preflight_done = True
            if await self._preflight():
                raise StopConsumer()
        self.body_size += len(chunk)
        limit = conf.get().MAX_BODY_BYTES
        if self.body_size > limit:
            await self._send_json(413, jsonrpc.error_response(None, payload_too_large(limit)))
            raise StopConsumer()
        if chunk:
            self.body.append(chunk)
        if message.get("more_body"):
            return
        try:
            await self.handle(b"".join(self.body))
        except UNAVAILABLE as exc:
            # The database is away: a retryable 503, never a 500 or a hang.
            logger.warning("database unavailable: %s", type(exc).__name__)
            await self._unavailable()
        except Exception:
            logger.exception("MCP transport error")
            if not self.streaming:
                await self._send_json(500, jsonrpc.error_response(None, McpError(INTERNAL_ERROR, "Internal error")))
            else:
                await self.stream.close()
        if not self.streaming or self.stream.closed:
            await self.disconnect()
            raise StopConsumer()

    async def _preflight(self) -> bool:
        """Refuse before reading the body: too large by Content-Length, bad Host/Origin, no auth.

        Returns True when a response was sent.
        """
        try:
            self.gate.check_declared_size()
            if self.scope.get("method") == "POST":
                self.gate.check_host_and_origin()
                self.gate.check_protocol_header()
                self.auth = await self.gate.authenticate()
        except (HttpError, AuthError) as exc:
            await self._send_json(exc.status, exc.body, exc.headers)
            return True
        return False

    async def disconnect(self) -> None:
        """Leave groups, stop background work, release a tasks/result stream binding."""
        if self._stream is not None:
            await self._stream.disconnect()

    # --- request entry -----------------------------------------------------------------------

    async def handle(self, body: bytes) -> None:
        """Apply the transport rules and route by HTTP method."""
        gate = self.gate
        try:
            gate.check_host_and_origin()
            method = self.scope["method"]
            if method == "OPTIONS":
                await self._send_raw(204, b"", [(b"access-control-max-age", b"600")])
                return
            if method not in ("POST", "GET", "DELETE"):
                raise HttpError(405, "Method not allowed", headers={"Allow": "GET, POST, DELETE, OPTIONS"})
            if method == "GET" and gate.is_a_browser():
                await self._send_raw(200, gate.landing_page(), list(gate.LANDING_HEADERS))
                return
            gate.check_protocol_header()
            if self.auth is None:
                self.auth = await gate.authenticate()
            if method == "POST":
                await self._post(body, self.auth)
            elif method == "GET":
                await get_stream.serve(self.stream, gate=gate, auth=self.auth)
            else:
                session, _ = await session_era.load_session(gate, auth=self.auth)
                await database_sync_to_async(sessions.end_session)(session=session)
                await self._send_raw(204, b"", [])
        except (HttpError, AuthError) as exc:
            await self._send_json(exc.status, exc.body, exc.headers)

    async def _post(self, body: bytes, auth: AuthContext) -> None:
        gate = self.gate
        gate.check_accept("application/json", "text/event-stream")
        ctype = gate.header("content-type").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise HttpError(415, "Unsupported Media Type: Content-Type must be application/json")
        try:
            raw = jsonrpc.loads(body)
            msg = jsonrpc.parse_message(raw, scan_strings=jsonrpc.may_hold_unstorable(body))
        except McpError as exc:
            rid = jsonrpc.request_id_of(raw) if exc.code != PARSE_ERROR else None
            await self._send_json(400, jsonrpc.error_response(rid, exc))
            return
        # --- era2026 hook: per-request _meta / no session is MCP 2026-07-28 (mcptasks.methods.era2026).
        if era2026_transport.selects(gate.headers(), raw):
            await self._send_reply(await era2026_transport.serve(
                msg, headers=gate.headers(), raw_headers=self.scope.get("headers", []), auth=auth,
                resource_url=gate.resource_url,
            ))
            return
        gate.check_protocol_header(body_read=True)
        # --- end era2026 hook
        reply = await session_era.handle(msg, gate=gate, auth=auth, open_stream=self._open_stream)
        if not isinstance(reply, StreamReply):
            await self._send_reply(reply)
        elif reply.mode == "task_result":
            assert isinstance(msg, jsonrpc.JSONRPCRequest)
            await ResultWaiter(self.stream, auth=auth, task=reply.task, request_id=msg.id).start()
        else:
            self.stream.kind = reply.mode

    async def _open_stream(self, session: Any, prefix: str, *,
                           before_priming: Callable[[str], Awaitable[None]] | None = None) -> str:
        # The stream is made only now: a plain JSON answer (the hot path) never needs one.
        return await self.stream.open(prefix, session_id=session.pk if session is not None else None,
                                      before_priming=before_priming)

    # --- writing -----------------------------------------------------------------------------

    async def _send_reply(self, reply: Reply) -> None:
        """Write what an era's request path returned (see :mod:`.replies`)."""
        if isinstance(reply, ListenReply):
            assert self.auth is not None
            refused = await listen_feed.open_listen(self.stream, reply.listen, auth=self.auth)
            if refused is not None:
                await self._send_reply(refused)
        elif isinstance(reply, SseReply):
            await self.send_headers(status=200, headers=[*sse.HEADERS, *self.gate.cors_headers])

            async def send(frame: bytes) -> None:
                await self.send_body(frame, more_body=True)

            last = await reply.produce(send)
            await self.send_body(last, more_body=False)
            self.responded = True
        elif self.streaming:
            # A plain tools/call opens its SSE response before its row is created (and refused,
            # e.g. by the quota): then the error is the stream's last event, as its result would be.
            await self.stream.send_last(reply.payload)
        elif reply.payload is None:
            await self._send_raw(reply.status, b"", [])
        else:
            await self._send_json(reply.status, reply.payload, reply.headers)

    async def _send_raw(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.responded = True
        if status not in (204, 304):  # which carry no Content-Length (RFC 9110 8.6)
            # Without it the server frames a whole reply as chunks: a client or proxy then learns
            # the body's length only at its end (the SDK peer declares it too).
            headers = [*headers, (b"content-length", b"%d" % len(body))]
        await self.send_response(status, body, headers=[*headers, *self.gate.cors_headers])

    async def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        hdrs = [(b"content-type", b"application/json")]
        for k, v in (headers or {}).items():
            hdrs.append((k.lower().encode("latin-1"), v.encode("latin-1")))
        body = b"" if payload is None else jsonrpc.encode(payload).encode()
        await self._send_raw(status, body, hdrs)
