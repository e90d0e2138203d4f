"""A small MCP Streamable HTTP client for tests, validating everything the server sends."""

from __future__ import annotations

import itertools
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.schema import validate_server_message

ACCEPT_BOTH = "application/json, text/event-stream"


@dataclass
class SseEvent:
    """One parsed SSE event."""

    id: str | None
    data: str
    retry: int | None = None

    @property
    def message(self) -> dict[str, Any] | None:
        """The JSON-RPC message, or None for a priming/empty event."""
        return json.loads(self.data) if self.data.strip() else None


def iter_sse(lines: Iterator[str]) -> Iterator[SseEvent | str]:
    """Parse SSE lines; yields events, and comment strings (``": ..."``) as plain str."""
    ev_id: str | None = None
    data: list[str] = []
    retry: int | None = None
    seen_data = False
    for raw in lines:
        line = raw.rstrip("\r")
        if line == "":
            if seen_data:
                yield SseEvent(ev_id, "\n".join(data), retry)
            ev_id, data, retry, seen_data = None, [], None, False
            continue
        if line.startswith(":"):
            yield line
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            ev_id = value
        elif name == "data":
            data.append(value)
            seen_data = True
        elif name == "retry" and value.isdigit():
            retry = int(value)


@dataclass
class Reply:
    """What the server answered to one POSTed request."""

    status: int
    headers: httpx.Headers
    content_type: str
    message: dict[str, Any] | None  # the JSON-RPC response (None if the stream ended without one)
    events: list[SseEvent] = field(default_factory=list)  # SSE events, priming included
    body: bytes = b""

    @property
    def result(self) -> dict[str, Any]:
        assert self.message is not None and "result" in self.message, self.message
        return self.message["result"]  # type: ignore[no-any-return]

    @property
    def error(self) -> dict[str, Any]:
        assert self.message is not None and "error" in self.message, self.message
        return self.message["error"]  # type: ignore[no-any-return]

    @property
    def notifications(self) -> list[dict[str, Any]]:
        return [e.message for e in self.events if e.message and "method" in e.message and "id" not in e.message]

    @property
    def requests(self) -> list[dict[str, Any]]:
        return [e.message for e in self.events if e.message and "method" in e.message and "id" in e.message]


class McpClient:
    """Talks to one MCP endpoint over Streamable HTTP; one session at a time."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        protocol_version: str = "2025-11-25",
        capabilities: dict[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url
        self.token = token
        self.protocol_version = protocol_version
        self.capabilities = capabilities if capabilities is not None else {"elicitation": {}, "sampling": {}}
        self.session_id: str | None = None
        self.http = httpx.Client(timeout=timeout)
        self._ids = itertools.count(1)
        self.received: list[dict[str, Any]] = []

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> McpClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def headers(self, **extra: str) -> dict[str, str]:
        h = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if self.session_id:
            h["Mcp-Session-Id"] = self.session_id
            h["MCP-Protocol-Version"] = self.protocol_version
        h.update(extra)
        return h

    def initialize(self) -> Reply:
        reply = self.request(
            "initialize",
            {
                "protocolVersion": self.protocol_version,
                "capabilities": self.capabilities,
                "clientInfo": {"name": "mcptasks-tests", "version": "1"},
            },
        )
        assert reply.status == 200, reply.body
        self.session_id = reply.headers["mcp-session-id"]
        self.protocol_version = reply.result["protocolVersion"]
        self.notify("notifications/initialized")
        return reply

    def notify(self, method: str, params: dict[str, Any] | None = None) -> httpx.Response:
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            body["params"] = params
        return self.http.post(self.url, json=body, headers=self.headers())

    def respond(self, rid: Any, result: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
                url: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
        if error is not None:
            body["error"] = error
        else:
            body["result"] = result or {}
        return self.http.post(url or self.url, json=body, headers=self.headers())

    def request(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        on_request: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
        on_event: Callable[[SseEvent], bool | None] | None = None,
        rid: Any = None,
        headers: dict[str, str] | None = None,
        answer_url: str | None = None,
    ) -> Reply:
        """POST a request and read the reply (JSON, or SSE until the response or stream end).

        ``on_request`` answers server->client requests seen on the stream (its return value is
        POSTed back as the result, to ``answer_url`` if given). ``on_event`` sees each event;
        returning True stops reading (drops the connection).
        """
        rid = next(self._ids) if rid is None else rid
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            body["params"] = params
        with self.http.stream("POST", self.url, json=body, headers={**self.headers(), **(headers or {})}) as resp:
            return self._read(resp, method, on_request, on_event, answer_url)

    def _read(
        self,
        resp: httpx.Response,
        method: str | None,
        on_request: Callable[[dict[str, Any]], dict[str, Any] | None] | None,
        on_event: Callable[[SseEvent], bool | None] | None,
        answer_url: str | None,
    ) -> Reply:
        ctype = resp.headers.get("content-type", "")
        if "text/event-stream" not in ctype:
            raw = resp.read()
            message = json.loads(raw) if raw and "json" in ctype else None
            if message is not None:
                validate_server_message(message, method)
                self.received.append(message)
            return Reply(resp.status_code, resp.headers, ctype, message, body=raw)
        events: list[SseEvent] = []
        final: dict[str, Any] | None = None
        for item in iter_sse(resp.iter_lines()):
            if isinstance(item, str):
                continue
            events.append(item)
            msg = item.message
            if msg is not None:
                is_response = "method" not in msg
                validate_server_message(msg, method if is_response else None)
                self.received.append(msg)
                if "method" in msg and "id" in msg and on_request is not None:
                    answer = on_request(msg)
                    if answer is not None:
                        r = self.respond(msg["id"], answer, url=answer_url)
                        assert r.status_code == 202, r.text
                if is_response:
                    final = msg
            if on_event is not None and on_event(item):
                break
            if final is not None:
                break
        return Reply(resp.status_code, resp.headers, ctype, final, events)

    def resume(self, last_event_id: str, *, method: str | None = None,
               on_event: Callable[[SseEvent], bool | None] | None = None,
               on_request: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None) -> Reply:
        """GET with Last-Event-ID: replay what the stream missed (reads until a response or on_event stops)."""
        h = self.headers(**{"Last-Event-ID": last_event_id, "Accept": "text/event-stream"})
        h.pop("Content-Type", None)
        with self.http.stream("GET", self.url, headers=h) as resp:
            return self._read(resp, method, on_request, on_event, None)

    def listen(self, on_event: Callable[[SseEvent], bool | None], *, last_event_id: str | None = None,
               on_open: Callable[[httpx.Response], None] | None = None) -> Reply:
        """Open the standalone GET stream and feed events to ``on_event`` until it returns True.

        ``on_open`` gets the response as soon as its headers arrive (a caller in another thread
        can then cut the connection; see ``cut``)."""
        h = self.headers(Accept="text/event-stream")
        h.pop("Content-Type", None)
        if last_event_id:
            h["Last-Event-ID"] = last_event_id
        with self.http.stream("GET", self.url, headers=h) as resp:
            if on_open is not None:
                on_open(resp)
            return self._read(resp, None, None, on_event, None)

    def call(self, name: str, arguments: dict[str, Any] | None = None, **kw: Any) -> Reply:
        """tools/call."""
        params: dict[str, Any] = {"name": name, "arguments": arguments or {}}
        if "task" in kw:
            params["task"] = kw.pop("task")
        if "meta" in kw:
            params["_meta"] = kw.pop("meta")
        return self.request("tools/call", params, **kw)

    def call_task(self, name: str, arguments: dict[str, Any] | None = None, ttl: int | None = None,
                  **kw: Any) -> dict[str, Any]:
        """Task-augmented tools/call; returns the Task object."""
        task: dict[str, Any] = {} if ttl is None else {"ttl": ttl}
        reply = self.call(name, arguments, task=task, **kw)
        return reply.result["task"]  # type: ignore[no-any-return]


def cut(resp: httpx.Response) -> None:
    """Shut down the socket under a streaming response from another thread.

    Closing the client does not wake a thread blocked reading the stream (it waits for the
    server's next keep-alive); a socket shutdown does, at once."""
    stream = resp.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed
