"""The MCP endpoint: Streamable HTTP (POST, GET, DELETE; JSON and SSE) as a Channels consumer.

The consumer is thin: it applies the HTTP rules, authenticates, parses one JSON-RPC message,
calls the dispatcher and writes JSON or SSE. Anything that outlives the request (a tool run, a
blocking ``tasks/result``) arrives as stream events through the channel layer, so the process
that answers need not be the one that did the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import secrets
import weakref
from typing import Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http.request import split_domain_port, validate_host
from pydantic import ValidationError

from tenants import conf as tenant_conf
from tenants import jwt_issuers
from tenants.auth import AuthContext, AuthError, authenticate, cached_context, remember
from tenants.coalesce import SingleFlight
from tenants.conf import tenant_resource

from .. import bus, conf, layers, limits, metrics, observability, selectors, services, watch
from ..era2026 import transport as era2026_transport
from ..era2026.listen import Listen
from ..handlers import RequestContext, StreamReply, dispatcher
from ..models import McpSession, StreamEvent, Task
from ..protocol import jsonrpc, versions
from ..protocol.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    TASK_EXPIRED,
    TASK_NOT_FOUND,
    McpError,
)
from ..protocol.messages import CLIENT_NOTIFICATIONS, TASK_ID_PATTERN, CancelledNotificationParams
from . import admission, errors, sse
from .errors import UNAVAILABLE
from .replies import JsonReply, ListenReply, Reply, SseReply

logger = logging.getLogger(__name__)

_TASK_ID = re.compile(TASK_ID_PATTERN)

#: Consumers with an open SSE response in this process (closed with ``retry:`` on shutdown).
_LIVE_STREAMS: weakref.WeakSet[McpConsumer] = weakref.WeakSet()
metrics.count_objects("streams", lambda: len(_LIVE_STREAMS))
_counted_loop: asyncio.AbstractEventLoop | None = None


async def close_all_streams() -> int:
    """Server shutdown: end every open SSE response of this process with a ``retry:`` hint.

    Clients reconnect (with ``Last-Event-ID``) to another process and lose nothing: every
    event is stored before it is sent. Returns how many streams were closed.
    """
    closed = 0
    for consumer in list(_LIVE_STREAMS):
        if consumer.closed:
            continue
        try:
            await consumer._close(hint_retry=True)  # a listen ends with its SubscriptionsListenResult
            closed += 1
        except Exception:
            logger.debug("closing a stream at shutdown failed", exc_info=True)
    return closed


class HttpError(Exception):
    """An HTTP-level refusal: status, optional JSON-RPC error body, extra headers."""

    def __init__(
        self, status: int, message: str, *, code: int = INVALID_REQUEST, headers: dict[str, str] | None = None,
        body: Any = None, rid: str | int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}
        self.body = body if body is not None else jsonrpc.error_response(rid, McpError(code, message))


#: Verifications of one credential (by its cache key, a digest) under way in this process:
#: concurrent requests share them.
_verifications: SingleFlight[bytes, AuthContext] = SingleFlight()


def _read_task_id(msg: Any) -> str | None:
    """The task id of a well-formed ``tasks/get``/``tasks/result`` request, else None."""
    if not isinstance(msg, jsonrpc.JSONRPCRequest) or msg.method not in ("tasks/get", "tasks/result"):
        return None
    task_id = msg.params.get("taskId") if isinstance(msg.params, dict) else None
    return task_id if isinstance(task_id, str) and _TASK_ID.fullmatch(task_id) else None


def _accepts(header: str, *types: str) -> bool:
    listed = {part.split(";")[0].strip().lower() for part in header.split(",")}
    return all(t in listed or "*/*" in listed for t in types)


def _prefers_html(header: str) -> bool:
    """Whether an ``Accept`` header is a browser's: ``text/html`` ranks highest and no MCP stream type
    (``text/event-stream``) is listed at all (an MCP client's GET always lists it)."""
    ranked: list[tuple[float, str]] = []
    for part in header.split(",")[:32]:  # bounded: a hostile header costs nothing
        media, _, params = part.partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        ranked.append((q, media.strip().lower()))
    types = {media for _q, media in ranked}
    if "text/event-stream" in types or "text/html" not in types:
        return False
    best = max(q for q, _media in ranked)
    return best > 0 and any(media == "text/html" and q == best for q, media in ranked)


class McpConsumer(AsyncHttpConsumer):
    """One HTTP request to the MCP endpoint (a POST, a GET stream or a DELETE)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.body_size = 0
        self.preflight_done = False
        self.responded = False  # a complete (non-streaming) response was sent
        self.streaming = False  # SSE headers sent; the consumer lives on after handle()
        self.closed = False
        self.stream_id: str | None = None
        self.mode = ""  # request | task_result | get | resume
        # The next sequence number of our stream to write. Sequence numbers are gap-free per
        # stream, so an event that arrives early reveals the ones still in flight, which are
        # then read back from the store: nothing is skipped, nothing is sent twice.
        self.next_seq = 1
        self.sent_rpc_ids: set[str] = set()
        self.task: Task | None = None
        self.session: McpSession | None = None
        self.auth: AuthContext | None = None
        self.groups_joined: list[str] = []
        self.background: list[asyncio.Task[Any]] = []
        self.cors_headers: list[tuple[bytes, bytes]] = []
        self.result_published = False
        self.result_request_id: str | int | None = None
        # Set while the channel layer is failing: we poll the store and try to rejoin groups.
        self.layer_degraded = False
        self._host_checked = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._parsed_headers: dict[str, str] | None = None
        self.prefetched: selectors.SessionAndTask | None = None
        # The well-formed task id a tasks/get or tasks/result names (see _read_task_id).
        self.named_task_id: str | None = None
        # The GET stream slot this connection holds (limits.streams), released when it ends.
        self._stream_slot: tuple[limits.Owner, str] | None = None
        # A 2026-07-28 subscriptions/listen this connection serves (mode "listen").
        self.listen: Listen | None = None
        # Wake-ups of the listen not read yet (task ids; ``_listen_all``: every watched task),
        # and the one coroutine reading them: wake-ups arriving during a read share the next.
        self._listen_due: set[str] = set()
        self._listen_all = False
        self._listen_reader: asyncio.Task[None] | None = None
        self._listen_error: BaseException | None = None

    # Made on first use: a plain JSON answer (the hot path) never needs them.

    @functools.cached_property
    def takeover_token(self) -> str:
        """Names this stream's holder in a takeover (a resumed stream closes the previous one)."""
        return secrets.token_hex(8)

    @functools.cached_property
    def _local(self) -> asyncio.Queue[dict[str, Any]]:
        # Messages to ourselves (re-checks, the scheduled close, fallback polls): a local queue,
        # never the channel layer, so they work whatever state Redis is in.
        return asyncio.Queue()

    @functools.cached_property
    def _layer_ok(self) -> asyncio.Event:
        # Cleared while the channel layer is failing.
        ok = asyncio.Event()
        ok.set()
        return ok

    @functools.cached_property
    def _layer_wanted(self) -> asyncio.Event:
        # Set once we joined a group: only then can the layer hold anything for us.
        return asyncio.Event()

    # --- ASGI plumbing ------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Channels' consumer loop, with the channel layer as an accelerator, not a dependency.

        Three sources feed :meth:`dispatch`: the HTTP connection, our local queue and the
        channel layer. A failing layer receive (Redis down, frozen, restarted) does not end the
        consumer as it would in Channels (leaving a deaf stream that only sends keep-alives):
        the stream re-reads the database every ``LAYER_FALLBACK_POLL_S`` until it has rejoined
        its groups.
        """
        global _counted_loop
        self.scope = scope
        observability.start_request_log()
        self._loop = asyncio.get_running_loop()
        if self._loop is not _counted_loop:  # once per event loop, not per request
            _counted_loop = self._loop
            metrics.note_loop(self._loop)
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.base_send = send
        try:
            with contextlib.suppress(StopConsumer):
                # Until a stream opens, only the HTTP connection can send us anything: read it
                # directly. A plain JSON answer (tasks/get, the hot path) then ends here without
                # starting, and cancelling, a waiter per source.
                while not self.streaming:
                    await self.dispatch(await receive())
                sources: list[Any] = [receive, self._local.get]
                if self.channel_layer is not None:
                    # Messages sent to our channel since we joined a group wait in the layer.
                    sources.append(self._layer_receive)
                await await_many_dispatch(sources, self.dispatch)
        finally:
            # However the consumer ends (finished, disconnected, cancelled by the server), no
            # timer or fallback poll outlives it.
            self.closed = True
            for t in self.background:
                t.cancel()
            layers.remove_listener(self)
            # Messages still addressed to this channel (a notification on its way, a group
            # whose discard failed) are dropped instead of buffered for ever.
            layers.forget_channel(self.channel_layer, getattr(self, "channel_name", None))
            if self._stream_slot is not None:
                limits.streams.release(*self._stream_slot)
                self._stream_slot = None

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch, answering a database outage with 503 wherever it surfaces."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        try:
            # Channels would first close stale database connections (a thread hop on every
            # message). Every ORM call here goes through database_sync_to_async, which does that
            # in its own thread before and after the call; async reads use their own connection.
            await handler(message)
        except (OperationalError, InterfaceError) as exc:
            logger.warning("database unavailable: %s", type(exc).__name__)
            await self._unavailable()
            raise StopConsumer() from None

    async def _unavailable(self) -> None:
        if self.closed:
            return
        if not self.streaming and not self.responded:
            error, status, headers = errors.answer(OperationalError())
            await self._send_json(status, jsonrpc.error_response(None, error), headers)
        elif self.streaming:
            await self._close(hint_retry=True)

    async def _layer_receive(self) -> dict[str, Any]:
        # Only a consumer that joined a group can be sent anything: a plain JSON answer
        # (tasks/get, the hot path) never starts a layer receive at all.
        await self._layer_wanted.wait()
        await self._layer_ok.wait()
        try:
            return dict(await self.channel_layer.receive(self.channel_name))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Every stream of the process fails at once: one warning per outage, not per stream.
            log = logger.debug if layers.send_breaker.is_open else logger.warning
            log("channel layer receive failed (%s); stream falls back to the database", type(exc).__name__)
            layers.report_failure(exc, open_s=tenant_conf.get().REDIS_BREAKER_S)
            self.layer_failed()
            await asyncio.sleep(conf.get().LAYER_FALLBACK_POLL_S)
            return {"type": "layer.poll"}

    def layer_failed(self) -> None:
        """The channel layer failed in this process (any thread): poll the store, then rejoin."""
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._degrade)

    def _degrade(self) -> None:
        if self.closed or self.layer_degraded:
            return
        self.layer_degraded = True
        self._layer_ok.clear()
        self.background.append(asyncio.ensure_future(self._layer_monitor()))

    async def _layer_monitor(self) -> None:
        try:
            while self.layer_degraded and not self.closed:
                await asyncio.sleep(conf.get().LAYER_FALLBACK_POLL_S)
                self._local.put_nowait({"type": "layer.poll"})
        except asyncio.CancelledError:
            pass

    async def layer_poll(self, message: dict[str, Any]) -> None:
        """Fallback tick: rejoin our groups if Redis answers again, and catch up from the store."""
        if self.closed:
            raise StopConsumer()
        if self.layer_degraded and await self._rejoin():
            logger.info("stream %s rejoined its channel-layer groups", self.stream_id)
            self.layer_degraded = False
            self._layer_ok.set()
        await self._catch_up()
        if self.closed:
            raise StopConsumer()

    async def _rejoin(self) -> bool:
        layer = self.channel_layer
        if layer is None:
            return True
        try:
            for group in self.groups_joined:
                await asyncio.wait_for(
                    layer.group_add(group, self.channel_name), timeout=max(1.0, conf.get().LAYER_SEND_TIMEOUT_S)
                )
        except asyncio.CancelledError:
            raise
        except Exception:
            return False
        layers.send_breaker.succeeded()
        return True

    async def _catch_up(self) -> None:
        """Write whatever the store has past our position (and re-check a awaited task)."""
        if self.closed or self.stream_id is None or not self.streaming:
            return
        if self.listen is not None:
            # A listen has no stored events: re-read its tasks (through its one reader, so a
            # stale read can never be sent after a newer one).
            self._listen_wake(None)
            return
        await self._replay_stored()
        if self.mode == "task_result" and self.task is not None and not self.closed:
            await self._check_task()

    async def _replay_stored(self) -> None:
        """Write the stored events past our position that the channel layer has not brought us."""
        if self.closed or self.stream_id is None or not self.streaming:
            return
        await self._replay(await self._stored_events(self.stream_id, self.next_seq - 1))

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
            await self._send_json(413, jsonrpc.error_response(None, errors.payload_too_large(limit)))
            raise StopConsumer()
        if chunk:
            self.body.append(chunk)
        if message.get("more_body"):
            return
        try:
            await self.handle(b"".join(self.body))
        except (OperationalError, InterfaceError) as exc:
            # The database is away: a retryable 503, never a 500 or a hang.
            logger.warning("database unavailable: %s", type(exc).__name__)
            await self._unavailable()
        except Exception:
            logger.exception("MCP transport error")
            if not self.streaming:
                await self._send_json(500, jsonrpc.error_response(None, McpError(INTERNAL_ERROR, "Internal error")))
            else:
                await self._close()
        if not self.streaming or self.closed:
            await self.disconnect()
            raise StopConsumer()

    async def _preflight(self) -> bool:
        """Refuse before reading the body: too large by Content-Length, bad Host/Origin, no auth.

        Returns True when a response was sent.
        """
        try:
            declared, limit = self._header("content-length"), conf.get().MAX_BODY_BYTES
            if declared.isdigit() and int(declared) > limit:
                raise HttpError(413, errors.payload_too_large(limit).message)
            if self.scope.get("method") == "POST":
                self._check_host_and_origin()
                self._check_protocol_header()
                self.auth = await self._authenticate()
        except HttpError as exc:
            await self._send_json(exc.status, exc.body, exc.headers)
            return True
        except AuthError as exc:
            await self._send_json(exc.status, exc.body, exc.headers)
            return True
        return False

    async def disconnect(self) -> None:
        """Leave groups, stop background work, release a tasks/result stream binding."""
        for t in self.background:
            t.cancel()
        layer = self.channel_layer
        if layer is not None and not self.layer_degraded:
            for group in self.groups_joined:
                try:
                    await asyncio.wait_for(
                        layer.group_discard(group, self.channel_name), timeout=conf.get().LAYER_SEND_TIMEOUT_S
                    )
                except Exception:
                    # Memberships expire on their own (group_expiry); never fail a disconnect.
                    logger.debug("group_discard failed", exc_info=True)
                    break
        self.groups_joined = []
        layers.remove_listener(self)
        if self.mode == "task_result" and self.task is not None and self.stream_id and self.auth is not None:
            await database_sync_to_async(services.bind_result_stream)(
                auth=self.auth, task=self.task, stream_id=None, only_if=self.stream_id
            )

    async def _join(self, group: str) -> None:
        """Join ``group``; if the layer fails, the stream falls back to the store (and rejoins)."""
        if self.channel_layer is None:
            return
        if not self.groups_joined:
            # Named only now: a request that never joins a group never needs a channel.
            self.channel_name = await self.channel_layer.new_channel()
        self.groups_joined.append(group)
        self._layer_wanted.set()
        if self.layer_degraded:
            return
        try:
            await asyncio.wait_for(
                self.channel_layer.group_add(group, self.channel_name), timeout=conf.get().LAYER_SEND_TIMEOUT_S
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            layers.report_failure(exc, open_s=tenant_conf.get().REDIS_BREAKER_S)
            self._degrade()

    # --- request entry -----------------------------------------------------------------------

    async def handle(self, body: bytes) -> None:
        """Apply the transport rules and route by HTTP method."""
        try:
            self._check_host_and_origin()
            method = self.scope["method"]
            if method == "OPTIONS":
                await self._send_raw(204, b"", [(b"access-control-max-age", b"600")])
                return
            if method not in ("POST", "GET", "DELETE"):
                raise HttpError(405, "Method not allowed", headers={"Allow": "GET, POST, DELETE, OPTIONS"})
            if method == "GET" and self._is_a_browser():
                await self._explain_to_browser()
                return
            self._check_protocol_header()
            if self.auth is None:
                self.auth = await self._authenticate()
            if method == "POST":
                await self._post(body)
            elif method == "GET":
                await self._get()
            else:
                await self._delete()
        except HttpError as exc:
            await self._send_json(exc.status, exc.body, exc.headers)
        except AuthError as exc:
            await self._send_json(exc.status, exc.body, exc.headers)

    def _is_a_browser(self) -> bool:
        """Somebody opened the endpoint in a browser: it asks for HTML and carries nothing of MCP."""
        headers = self._headers()
        if any(h in headers for h in ("mcp-session-id", "authorization", "mcp-protocol-version", "last-event-id")):
            return False
        return _prefers_html(headers.get("accept", ""))

    async def _explain_to_browser(self) -> None:
        """A small HTML page saying what this URL is, instead of a JSON error nobody asked for."""
        from django.template.loader import render_to_string

        page = render_to_string("mcptasks/landing.html", {
            "title": "mcptasks: the MCP endpoint", "mcp_url": self._resource_url(), "endpoint": True,
        })
        await self._send_raw(200, page.encode(), [
            (b"content-type", b"text/html; charset=utf-8"), (b"cache-control", b"no-store"), (b"vary", b"Accept"),
        ])

    def _header(self, name: str) -> str:
        """The first value of header ``name`` (lower case), or ""."""
        return self._headers().get(name, "")

    def _headers(self) -> dict[str, str]:
        """The request's headers by lower-case name (the first of repeated ones), decoded once."""
        parsed = self._parsed_headers
        if parsed is None:
            parsed = {}
            for k, v in self.scope.get("headers", []):
                parsed.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
            self._parsed_headers = parsed
        return parsed

    def _check_host_and_origin(self) -> None:
        if self._host_checked:
            return  # once per request (the preflight and handle() both ask)
        host = self._header("host")
        domain, _port = split_domain_port(host)
        if not host or not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
            # DNS rebinding: a foreign Host never reaches the application.
            raise HttpError(400, f"Invalid Host header: {host[:100]!r}")
        origin = self._header("origin")
        if origin:
            allowed = conf.get().ALLOWED_ORIGINS
            same_origin = origin.split("://", 1)[-1].rstrip("/") == host
            if not (same_origin or "*" in allowed or origin.rstrip("/") in allowed):
                raise HttpError(403, f"Origin not allowed: {origin[:100]}")
            self.cors_headers = [
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"vary", b"Origin"),
                (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
                (
                    b"access-control-allow-headers",
                    # Mcp-Method, Mcp-Name: the 2026-07-28 routing headers (era2026).
                    b"Content-Type, Authorization, Mcp-Session-Id, MCP-Protocol-Version, Last-Event-ID, Accept, "
                    b"Mcp-Method, Mcp-Name",
                ),
                (b"access-control-expose-headers", b"Mcp-Session-Id, MCP-Protocol-Version, WWW-Authenticate"),
            ]
        self._host_checked = True

    def _check_protocol_header(self, *, body_read: bool = False) -> None:
        version = self._header("mcp-protocol-version")
        if version and not versions.is_supported(version):
            # era2026: a sessionless POST may be of the 2026-07-28 era, which answers this itself
            # (with the request id), so the check waits for the body (see _post).
            if not body_read and self.scope.get("method") == "POST" and not self._header("mcp-session-id"):
                return
            raise HttpError(400, f"Unsupported MCP-Protocol-Version: {version[:40]}")

    def _resource_url(self) -> str:
        public = tenant_conf.get().PUBLIC_URL
        path = tenant_conf.get().MCP_PATH
        tenant = self.scope.get("url_route", {}).get("kwargs", {}).get("tenant")
        if tenant:
            # A tenant's own endpoint (``/mcp/t/<slug>``): a resource of its own.
            path = tenant_resource(path, tenant)
        if public:
            return public.rstrip("/") + path
        scheme = "https" if self.scope.get("scheme") == "https" else "http"
        return f"{scheme}://{self._header('host')}{path}"

    async def _authenticate(self) -> AuthContext:
        qs = self.scope.get("query_string", b"").decode("latin-1")
        headers, resource_url = self._headers(), self._resource_url()
        # A token verified in the last AUTH_CACHE_S costs no database hop (tenants.auth_cache).
        key, ctx = cached_context(headers=headers, query_string=qs, resource_url=resource_url)
        if ctx is not None:
            if observability.JSON_LOGS:
                observability.bind_log(tenant=ctx.tenant_slug)
            return ctx
        scheme, _, token = self._header("authorization").strip().partition(" ")
        if scheme.lower() == "bearer" and token:
            # External JWTs: fetch signing keys here, off the shared database thread, so a
            # slow identity provider delays only its own tokens.
            await jwt_issuers.aprefetch(token.strip())
        try:
            # Requests presenting the same credential while it is being verified share the
            # verification (when a cached verdict lapses, every request in flight misses at once).
            def verify() -> Any:
                return database_sync_to_async(authenticate)(headers=headers, query_string=qs, resource_url=resource_url)

            ctx = await (verify() if key is None else _verifications.run(key, verify))
        except AuthError as exc:
            if token:
                # A credential was presented and refused (a bare 401 is OAuth discovery).
                await watch.aauth_failed(
                    ip=watch.client_ip(self.scope), status=exc.status, reason=exc.message,
                    path=self.scope.get("path", ""), tenant_slug=self._tenant_slug(),
                )
            raise
        remember(key, ctx)
        if observability.JSON_LOGS:
            observability.bind_log(tenant=ctx.tenant_slug)
        return ctx

    def _tenant_slug(self) -> str | None:
        """The tenant of a tenant endpoint (``/mcp/t/<slug>``; the route validated it), else None."""
        slug = self.scope.get("url_route", {}).get("kwargs", {}).get("tenant")
        return str(slug) if slug else None

    async def _load_session(
        self, *, required: bool = True, task_id: str | None = None, status_only: bool = False
    ) -> McpSession | None:
        """The request's session (400 without the header, 404 if it is not the caller's live one).

        ``task_id``: the request reads that task (``tasks/get``, ``tasks/result``); it is read in
        the same database round trip where possible and kept for the handler (``self.prefetched``).
        """
        sid = self._header("mcp-session-id")
        if not sid:
            if required:
                raise HttpError(400, "Bad Request: Mcp-Session-Id header is required")
            return None
        assert self.auth is not None
        both = None
        if task_id is not None:
            both = await selectors.aget_session_and_task(
                session_id=sid, auth=self.auth, task_id=task_id, status_only=status_only
            )
        if both is not None:
            session, self.prefetched = both.session, both
        else:
            session = await selectors.aget_session(session_id=sid, auth=self.auth)
        if session is None:
            raise HttpError(404, "Session not found")
        if services.session_needs_touch(session=session):
            await database_sync_to_async(services.touch_session)(session=session)
        return session

    # --- POST --------------------------------------------------------------------------------

    async def _post(self, body: bytes) -> None:
        if not _accepts(self._header("accept"), "application/json", "text/event-stream"):
            raise HttpError(406, "Not Acceptable: Accept must list application/json and text/event-stream")
        ctype = self._header("content-type").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise HttpError(415, "Unsupported Media Type: Content-Type must be application/json")
        try:
            raw = jsonrpc.loads(body)
            msg = jsonrpc.parse_message(raw, scan_strings=jsonrpc.may_hold_unstorable(body))
        except McpError as exc:
            rid = jsonrpc.request_id_of(raw) if exc.code != PARSE_ERROR else None
            await self._send_json(400, jsonrpc.error_response(rid, exc))
            return
        assert self.auth is not None
        # --- era2026 hook: per-request _meta / no session is MCP 2026-07-28 (mcptasks.era2026).
        if era2026_transport.selects(self._headers(), raw):
            await self._send_reply(await era2026_transport.serve(
                msg, headers=self._headers(), raw_headers=self.scope.get("headers", []), auth=self.auth,
                resource_url=self._resource_url,
            ))
            return
        self._check_protocol_header(body_read=True)
        # --- end era2026 hook
        if isinstance(msg, jsonrpc.JSONRPCRequest) and msg.method == "initialize":
            self.session = None  # initialize always opens a new session
        else:
            # Everything else needs the session initialize opened (spec: 400 without the header).
            self.named_task_id = _read_task_id(msg)
            status_only = isinstance(msg, jsonrpc.JSONRPCRequest) and msg.method == "tasks/get"
            self.session = await self._load_session(task_id=self.named_task_id, status_only=status_only)
        if isinstance(msg, jsonrpc.JSONRPCNotification):
            await self._notification(msg)
            await self._send_raw(202, b"", [])
            return
        if isinstance(msg, jsonrpc.JSONRPCResponse | jsonrpc.JSONRPCError):
            await self._client_response(msg)
            return
        assert isinstance(msg, jsonrpc.JSONRPCRequest)
        await self._request(msg)

    async def _notification(self, msg: jsonrpc.JSONRPCNotification) -> None:
        session = self.session
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
            await database_sync_to_async(services.cancel_request)(session=session, request_id=params.requestId)
        elif msg.method == "notifications/initialized":
            await database_sync_to_async(services.mark_initialized)(session=session)

    async def _client_response(self, msg: jsonrpc.JSONRPCResponse | jsonrpc.JSONRPCError) -> None:
        assert self.auth is not None
        if not isinstance(msg.id, str):
            raise HttpError(400, "Bad Request: no pending server request has that id")
        payload = msg.model_dump(mode="json", exclude_none=True)
        ok = await database_sync_to_async(services.answer_task_message)(
            auth=self.auth, rpc_id=msg.id, response=payload
        )
        if not ok:
            raise HttpError(400, "Bad Request: no pending server request has that id")
        await self._send_raw(202, b"", [])

    async def _request(self, msg: jsonrpc.JSONRPCRequest) -> None:
        assert self.auth is not None
        rid = msg.id
        # Clipped here too: the plain log format writes messages as they are.
        logger.debug("request %.100s id=%.100r", msg.method, rid)
        session = self.session
        version = session.protocol_version if session is not None else versions.LATEST
        ctx = RequestContext(
            auth=self.auth, session=session, protocol_version=version, request_id=rid, open_stream=self._open_stream,
            prefetched=self.prefetched,
        )
        # The one admission pipeline both eras run: initialized rule, scope, rate limits, fast polls.
        admitted = await admission.admit(
            table=dispatcher, ctx=ctx, auth=self.auth, method=msg.method, params=msg.params, request_id=rid,
            resource_url=self._resource_url, initialized=session is None or session.initialized,
        )
        if isinstance(admitted, JsonReply):
            await self._send_reply(admitted)
            return
        try:
            known = admitted.route is not None
            with observability.rpc_span(msg.method, msg.params, auth=self.auth, known=known) as span:
                result = await dispatcher.dispatch(ctx, msg.method, msg.params)
                observability.note_task(span, result)
        except UNAVAILABLE:
            raise  # answered (503) where every database outage is
        except Exception as exc:
            answered = await admission.failure(exc, auth=self.auth, method=msg.method)
            if answered is None:
                raise
            await self._refuse(rid, answered)
            return
        if isinstance(result, StreamReply):
            self.task = result.task
            self.mode = result.mode
            self.result_request_id = rid
            if result.mode == "task_result":
                await self._start_task_result()
            return
        extra: dict[str, str] = {}
        if ctx.new_session is not None:
            extra["Mcp-Session-Id"] = ctx.new_session.pk
        await self._send_json(200, jsonrpc.response(rid, result), extra)

    # --- streams -----------------------------------------------------------------------------

    async def _open_stream(self, prefix: str) -> str:
        """Start an SSE response for this request: join the stream's group, send the priming event."""
        stream_id = bus.new_stream_id(prefix)
        self.stream_id = stream_id
        await self._join(bus.stream_group(stream_id))
        if self.session is not None:
            await self._join(bus.session_group(self.session.pk))
        await self._start_sse(priming_id=bus.priming_id(stream_id, 0))
        return stream_id

    async def _start_sse(
        self, *, priming_id: str | None, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        headers = [*sse.HEADERS, *self.cors_headers, *(extra or [])]
        await self.send_headers(status=200, headers=headers)
        self.streaming = True
        _LIVE_STREAMS.add(self)
        layers.add_listener(self)
        if priming_id is not None:  # a listen is not resumable: no event ids, no priming event
            await self.send_body(sse.event("", event_id=priming_id, retry_ms=conf.get().SSE_RETRY_MS), more_body=True)
        self.background.append(asyncio.ensure_future(self._keepalive()))

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
                    await self._send_self({"type": "stream.close_connection"})
                    return
                await self.send_body(sse.comment(), more_body=True)
        except asyncio.CancelledError:
            pass

    async def _send_self(self, message: dict[str, Any]) -> None:
        self._local.put_nowait(message)

    async def _close(self, *, hint_retry: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if hint_retry and self.listen is not None:
            # The server ends a listen gracefully (shutdown, lifetime bound, database away):
            # its SubscriptionsListenResult tells the client to listen again.
            await self.send_body(self.listen.ending(), more_body=True)
        elif hint_retry:
            await self.send_body(sse.retry(conf.get().SSE_RETRY_MS), more_body=True)
        await self.send_body(b"", more_body=False)

    async def stream_event(self, message: dict[str, Any]) -> None:
        """A stored event of our stream arrived through the channel layer."""
        seq = int(message["seq"])
        if seq < self.next_seq or self.closed or self.stream_id is None:
            return
        if seq > self.next_seq:
            # Published by another process and still in flight to us: take them from the store.
            await self._replay(await self._stored_events(self.stream_id, self.next_seq - 1))
        if seq == self.next_seq and not self.closed:
            self.next_seq = seq + 1
            await self._emit(message["event_id"], message["data"])
        if self.closed:
            raise StopConsumer()

    async def _emit(self, event_id: str, data: str) -> None:
        payload = json.loads(data)
        if payload.get("_bind"):
            return  # bookkeeping of a tasks/result stream, never sent
        if payload.get("_close"):
            # The tool asked to close the connection (not the stream): the client resumes.
            # A resumed connection has already been through that point, so it stays open.
            if self.mode == "request":
                await self._close(hint_retry=True)
            return
        if payload.get("_end"):
            await self._close()
            return
        await self.send_body(sse.event(data, event_id=event_id), more_body=True)
        is_response = "method" not in payload and ("result" in payload or "error" in payload)
        if is_response and self.mode in ("request", "task_result", "resume"):
            await self._close()

    async def stream_takeover(self, message: dict[str, Any]) -> None:
        """A newer connection took over this GET stream: hand it over and close."""
        if message.get("token") != self.takeover_token:
            await self._close(hint_retry=True)
            raise StopConsumer()

    async def stream_close_connection(self, message: dict[str, Any]) -> None:
        """Scheduled connection close (stream lifetime bound)."""
        await self._close(hint_retry=True)
        raise StopConsumer()

    async def session_signal(self, message: dict[str, Any]) -> None:
        """The session was deleted: end its streams."""
        if message.get("event") == "ended":
            await self._close()
            raise StopConsumer()

    # --- tasks/result --------------------------------------------------------------------------

    async def _start_task_result(self, *, resumed: bool = False) -> None:
        assert self.task is not None and self.stream_id is not None
        if not resumed:
            # Remember which task and request id this stream answers: a client that resumes it
            # with Last-Event-ID (after a drop or a server-side close) still gets the result.
            await database_sync_to_async(bus.bind_stream)(
                session_id=self.task.session_id, stream_id=self.stream_id,
                task_id=self.task.task_id, rpc_id=self.result_request_id,
            )
        await self._join(bus.task_group(self.task.task_id))
        assert self.auth is not None
        await database_sync_to_async(services.bind_result_stream)(
            auth=self.auth, task=self.task, stream_id=self.stream_id
        )
        await self._check_task()
        if not self.closed:
            self.background.append(asyncio.ensure_future(self._recheck_loop()))

    async def _recheck_loop(self) -> None:
        # Backstop for lost wake-ups: a periodic re-read, not a tight poll loop.
        try:
            while not self.closed:
                await asyncio.sleep(conf.get().TASK_RESULT_RECHECK_S)
                await self._send_self({"type": "task.signal", "event": "recheck"})
        except asyncio.CancelledError:
            pass

    async def task_signal(self, message: dict[str, Any]) -> None:
        """Something happened to the task we stream the result of (or to one a listen watches)."""
        if self.listen is not None and not self.closed:
            task_id = message.get("task_id")
            self._listen_wake([task_id] if isinstance(task_id, str) else None)
            return
        if self.mode == "task_result" and not self.closed:
            if message.get("event") == "recheck":
                # The backstop re-reads the stream too, not only the task: an event stored for us
                # whose push was lost (a send skipped while this process's breaker was open, or
                # timed out) would otherwise wait for the stream's lifetime.
                await self._catch_up()
            else:
                await self._check_task()
            if self.closed:
                raise StopConsumer()

    async def _check_task(self) -> None:
        assert self.task is not None and self.stream_id is not None
        task = await database_sync_to_async(Task.objects.filter(pk=self.task.pk).first)()
        if task is None:
            await self._emit_direct(McpError(INVALID_PARAMS, TASK_NOT_FOUND))
            return
        self.task = task
        if not task.is_terminal and selectors.is_expired(task):
            # The ttl ran out while we waited: answer like tasks/get would.
            await self._emit_direct(McpError(INVALID_PARAMS, TASK_EXPIRED))
            return
        if not task.is_terminal:
            # Unbound while we still wait: a resumed stream shares its id with the dropped
            # connection, whose late end unbinds "our" id. Bind again (never over a newer
            # stream: only while none is bound); a tenant-wide reader's stream never binds.
            if task.stream_id is None and self.auth is not None and await database_sync_to_async(
                services.bind_result_stream
            )(auth=self.auth, task=task, stream_id=self.stream_id, only_if_unbound=True):
                task.stream_id = self.stream_id
            if task.stream_id != self.stream_id:
                # A newer tasks/result stream of this task receives its messages (never two).
                return
            pending = await database_sync_to_async(selectors.pending_messages)(task=task)
            delivered = False
            for m in pending:
                if m.rpc_id in self.sent_rpc_ids:
                    continue
                self.sent_rpc_ids.add(m.rpc_id)
                await database_sync_to_async(services.deliver_task_message)(
                    task=task, message=m, stream_id=self.stream_id
                )
                delivered = True
            if delivered:
                await self._replay_stored()  # what we stored ourselves never waits for the layer
            return
        if self.result_published:
            return  # a signal and a re-check can both see the terminal state
        self.result_published = True
        if self.auth is not None:
            await services.arecord_task_retrieval(auth=self.auth, task=task)
        result, error = services.task_result_payload(task=task)
        rid = self.result_request_id
        assert rid is not None
        if error is not None:
            message = jsonrpc.error_response(rid, McpError.from_error(error))
        else:
            message = jsonrpc.response(rid, result or {})
        await database_sync_to_async(bus.publish)(
            session_id=task.session_id, stream_id=self.stream_id, message=message
        )
        # This connection serves the stream: write the result from the store now instead of
        # waiting for its push to come back through the channel layer. A push that is lost (the
        # send skipped while this process's breaker is open, or timed out under load) left the
        # stream silent until its lifetime ended, since result_published stops later re-checks;
        # the push, when it arrives, is a duplicate by sequence and dropped.
        await self._replay_stored()

    async def _emit_direct(self, err: McpError) -> None:
        rid = self.result_request_id
        await self.send_body(sse.event(json.dumps(jsonrpc.error_response(rid, err))), more_body=True)
        await self._close()

    # --- subscriptions/listen (2026-07-28) ----------------------------------------------------

    async def start_listen(self, listen: Listen) -> None:
        """Serve a listen: acknowledge, send every watched task's current state, then its changes.

        Wake-ups are the ``task.signal`` of each watched task's group (what ``tasks/result``
        streams use); the periodic re-check and, while Redis fails, the fallback poll re-read the
        store. A listen counts against the principal's open-stream limit like a GET stream.
        """
        assert self.auth is not None
        stream_id = bus.new_stream_id("l")
        owner = (self.auth.tenant_id, self.auth.principal_id)
        limit = conf.get().MAX_STREAMS_PER_PRINCIPAL
        if not limits.streams.acquire(owner, stream_id, limit=limit):
            error = McpError(INVALID_REQUEST, f"Too many open streams: at most {limit} streams per principal "
                                              "on this server; close one and retry")
            await self._send_json(429, jsonrpc.error_response(listen.request_id, error), {"Retry-After": "5"})
            return
        self._stream_slot = (owner, stream_id)
        self.stream_id = stream_id
        self.mode = "listen"
        self.listen = listen
        # Join before the first read: a change made meanwhile is read again, never missed.
        for task_id in listen.task_ids:
            await self._join(bus.task_group(task_id))
        await self._start_sse(priming_id=None)
        await self.send_body(listen.acknowledgement(), more_body=True)
        # The current state once, right after the acknowledgement: a client that listens again
        # after a drop misses no terminal state.
        await self._listen_check(None)
        if listen.task_ids and not self.closed:
            self.background.append(asyncio.ensure_future(self._recheck_loop()))

    async def _listen_check(self, task_ids: list[str] | None) -> None:
        if self.listen is None or self.closed:
            return
        for frame in await self.listen.changes(task_ids):
            if self.closed:
                return
            await self.send_body(frame, more_body=True)

    def _listen_wake(self, task_ids: list[str] | None) -> None:
        """Have the listen re-read ``task_ids`` (None: all it watches) as soon as it can.

        The handler returns at once, so signals that arrive while a read is under way are
        dispatched meanwhile and gathered here: when many watched tasks change together, one
        read and rendering serves them all instead of one round trip each, queued one behind
        the other.
        """
        if task_ids is None:
            self._listen_all = True
        else:
            self._listen_due.update(task_ids)
        if self._listen_reader is None or self._listen_reader.done():
            self.background = [t for t in self.background if not t.done()]
            self._listen_reader = asyncio.ensure_future(self._listen_read())
            self.background.append(self._listen_reader)

    async def _listen_read(self) -> None:
        """Read and send what :meth:`_listen_wake` gathered until nothing is due (one at a time)."""
        try:
            while not self.closed and (self._listen_all or self._listen_due):
                task_ids = None if self._listen_all else list(self._listen_due)
                self._listen_all, self._listen_due = False, set()
                await self._listen_check(task_ids)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Raised again by the consumer's own dispatch (listen_failed), where a database
            # outage ends the listen with its result and anything else ends the connection,
            # exactly as when the read ran inside the signal's handler.
            self._listen_error = exc
            await self._send_self({"type": "listen.failed"})

    async def listen_failed(self, message: dict[str, Any]) -> None:
        """A listen read failed in :meth:`_listen_read`: fail here, in the consumer's dispatch."""
        error, self._listen_error = self._listen_error, None
        if error is not None:
            raise error

    # --- GET ---------------------------------------------------------------------------------

    async def _get(self) -> None:
        if not _accepts(self._header("accept"), "text/event-stream"):
            raise HttpError(406, "Not Acceptable: Accept must list text/event-stream")
        self.session = session = await self._load_session()
        assert session is not None
        last_event_id = self._header("last-event-id")
        if last_event_id:
            await self._resume(session, last_event_id)
            return
        self.mode = "get"
        self.stream_id = stream_id = bus.get_stream_id(session.pk)
        self._hold_stream_slot(session, stream_id)
        # One live connection per GET stream: a newer one replaces the older (never broadcast).
        await bus.group_send(bus.stream_group(stream_id), {"type": "stream.takeover", "token": self.takeover_token})
        # A fresh GET starts at the stream's current end. Read it before joining, then replay
        # whatever was stored in between: nothing published meanwhile is lost.
        floor = await database_sync_to_async(bus.last_seq)(stream_id)
        self.next_seq = floor + 1
        await self._join(bus.stream_group(stream_id))
        await self._join(bus.session_group(session.pk))
        await self._start_sse(priming_id=bus.priming_id(stream_id, floor))
        await self._replay(await self._stored_events(stream_id, floor))

    def _hold_stream_slot(self, session: McpSession, stream_id: str) -> None:
        """Count this GET stream against its principal's limit (429 past it; see mcptasks.limits)."""
        owner = (session.tenant_id, session.principal_id)
        limit = conf.get().MAX_STREAMS_PER_PRINCIPAL
        if not limits.streams.acquire(owner, stream_id, limit=limit):
            raise HttpError(
                429,
                f"Too many open streams: at most {limit} GET streams per principal on this server; "
                "close one (or end its session with DELETE) and retry",
                headers={"Retry-After": "5"},
            )
        self._stream_slot = (owner, stream_id)

    async def _resume(self, session: McpSession, last_event_id: str) -> None:
        parsed = bus.parse_event_id(last_event_id)
        if parsed is None:
            raise HttpError(400, "Bad Request: malformed Last-Event-ID")
        stream_id, seq = parsed
        binding = await database_sync_to_async(bus.stream_binding)(session_id=session.pk, stream_id=stream_id)
        owned = binding is not None or stream_id == bus.get_stream_id(session.pk) or await database_sync_to_async(
            StreamEvent.objects.filter(stream_id=stream_id, session_id=session.pk).exists
        )() or await database_sync_to_async(
            Task.objects.filter(stream_id=stream_id, session_id=session.pk).exists
        )()
        if not owned:
            raise HttpError(404, "Unknown stream for Last-Event-ID")
        self._hold_stream_slot(session, stream_id)
        self.stream_id = stream_id
        self.mode = "get" if stream_id.startswith("g") else "resume"
        if self.mode == "get":
            await bus.group_send(
                bus.stream_group(stream_id), {"type": "stream.takeover", "token": self.takeover_token}
            )
        # Join first, then replay: anything published meanwhile is deduplicated by sequence.
        await self._join(bus.stream_group(stream_id))
        await self._join(bus.session_group(session.pk))
        await self._start_sse(priming_id=bus.priming_id(stream_id, seq))
        self.next_seq = seq + 1
        events = await self._stored_events(stream_id, 0 if stream_id.startswith("r") else seq)
        marker: dict[str, Any] | None = binding
        for ev in events:
            # Requests already sent on this stream (seen, or about to be replayed) are not
            # queued on it a second time.
            payload = json.loads(ev.data)
            if "_bind" in payload:
                marker = marker or payload["_bind"]  # streams bound before the cursor columns
            elif "method" in payload and "id" in payload:
                self.sent_rpc_ids.add(str(payload["id"]))
        await self._replay([ev for ev in events if ev.seq > seq])
        if not self.closed and marker is not None:
            await self._resume_task_result(session, marker)

    async def _stored_events(self, stream_id: str, after: int) -> list[StreamEvent]:
        return await database_sync_to_async(
            lambda: list(StreamEvent.objects.filter(stream_id=stream_id, seq__gt=after).order_by("seq"))
        )()

    async def _replay(self, events: list[StreamEvent]) -> None:
        """Write stored events in order, from our position on (earlier ones were sent)."""
        for ev in events:
            if self.closed:
                break
            if ev.seq < self.next_seq:
                continue
            self.next_seq = ev.seq + 1
            await self._emit(ev.event_id, ev.data)

    async def _resume_task_result(self, session: McpSession, marker: dict[str, Any]) -> None:
        """A resumed tasks/result stream whose response is still due: serve it as before."""
        task = await database_sync_to_async(
            Task.objects.filter(task_id=str(marker.get("taskId")), session_id=session.pk).first
        )()
        self.result_request_id = marker.get("rid")
        if task is None:
            await self._emit_direct(McpError(INVALID_PARAMS, TASK_NOT_FOUND))
            return
        self.task = task
        self.mode = "task_result"
        await self._start_task_result(resumed=True)

    # --- DELETE ------------------------------------------------------------------------------

    async def _delete(self) -> None:
        session = await self._load_session()
        assert session is not None
        await database_sync_to_async(services.end_session)(session=session)
        await self._send_raw(204, b"", [])

    # --- writing -----------------------------------------------------------------------------

    async def _send_raw(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.responded = True
        await self.send_response(status, body, headers=[*headers, *self.cors_headers])

    async def _refuse(self, rid: Any, answered: tuple[McpError, int, dict[str, str]]) -> None:
        """Answer request ``rid`` with an error as the error table words it (``errors.answer``).

        A plain ``tools/call`` opens its SSE response before its row is created (and refused,
        e.g. by the quota): then the error is the stream's last event, as its result would be.
        """
        error, status, headers = answered
        if self.streaming:
            message = json.dumps(jsonrpc.error_response(rid, error), separators=(",", ":"))
            await self.send_body(sse.event(message), more_body=True)
            await self._close()
            return
        await self._send_json(status, jsonrpc.error_response(rid, error), headers)

    async def _send_reply(self, reply: Reply) -> None:
        """Write what an era's request path returned (see :mod:`.replies`)."""
        if isinstance(reply, ListenReply):
            await self.start_listen(reply.listen)
        elif isinstance(reply, SseReply):
            await self.send_headers(status=200, headers=[*sse.HEADERS, *self.cors_headers])

            async def send(frame: bytes) -> None:
                await self.send_body(frame, more_body=True)

            last = await reply.produce(send)
            await self.send_body(last, more_body=False)
            self.responded = True
        elif reply.payload is None:
            await self._send_raw(reply.status, b"", [])
        else:
            await self._send_json(reply.status, reply.payload, reply.headers)

    async def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        hdrs = [(b"content-type", b"application/json")]
        for k, v in (headers or {}).items():
            hdrs.append((k.lower().encode("latin-1"), v.encode("latin-1")))
        body = b"" if payload is None else json.dumps(payload, separators=(",", ":")).encode()
        await self._send_raw(status, body, hdrs)
