"""The 2026-07-28 side of the one MCP endpoint: era selection, header and ``_meta`` rules.

The consumer calls :func:`selects` on every parsed POST body and hands the request to
:func:`serve` when it belongs to this era: no ``Mcp-Session-Id``, not ``initialize``, and
either per-request ``_meta`` naming a protocol version or an ``MCP-Protocol-Version`` header
that no session-based revision has. Everything else is 2025-11-25 exactly as before.

:func:`serve` applies, in order: the ``_meta`` shape (-32602, HTTP 400), the protocol version
(-32022, HTTP 400), the SEP-2243 headers (-32020, HTTP 400; also when one of them is
repeated), the method table (-32601, HTTP
404), then the same scope check, rate limits and refusal audit as the 2025-11-25 path, and
dispatches. The caller was authenticated before the body was read, as for every POST.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from pydantic import ValidationError

from tenants import ratelimit
from tenants.auth import insufficient_scope
from tenants.exceptions import QuotaExceeded, RateLimited

from .. import conf, observability, watch
from ..protocol import era2026, jsonrpc, versions
from ..protocol.era2026 import META_PROTOCOL_VERSION, NAME_SOURCE, RequestMeta
from ..protocol.errors import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MISSING_CLIENT_CAPABILITY,
    UNSUPPORTED_PROTOCOL_VERSION,
    McpError,
)
from ..registry import registry
from ..transport import errors, sse
from ..transport.errors import UNAVAILABLE
from . import handlers, tasks
from .handlers import EraContext

if TYPE_CHECKING:
    from ..transport.consumer import McpConsumer

logger = logging.getLogger(__name__)

#: Codes this era answers with HTTP 400 (SEP-2243/2575) and 404 (unknown method).
_STATUS_BY_CODE = {
    HEADER_MISMATCH: 400, MISSING_CLIENT_CAPABILITY: 400, UNSUPPORTED_PROTOCOL_VERSION: 400, METHOD_NOT_FOUND: 404,
}
#: Methods whose ``Mcp-Name`` may be absent when ``ERA2026_TASKS_NAME_OPTIONAL`` is on (off by
#: default): the published Python client of the tasks extension (``mcp`` 2.3 under FastMCP 4.0)
#: sends none on them. A present value must always match ``params.taskId``.
_NAME_OPTIONAL = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
#: Longest header value quoted back in an error message (never the whole client string).
_QUOTE = 64


def selects(headers: dict[str, str], raw: Any) -> bool:
    """Whether a POST body belongs to the 2026-07-28 era (see the module docstring)."""
    if headers.get("mcp-session-id") or not isinstance(raw, dict):
        return False
    params = raw.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and META_PROTOCOL_VERSION in meta:
        return True  # per-request _meta: this era (where initialize is an unknown method)
    if raw.get("method") == "initialize":
        return False  # a 2025-11-25 handshake, whatever its header says
    version = headers.get("mcp-protocol-version", "")
    # 2026-07-28 without _meta (-32602), or a version nobody serves (-32022): answered here.
    return bool(version) and not versions.is_supported(version)


#: Headers SEP-2243 compares with the body: each may be sent once (``mcp-param-*`` by prefix).
_SINGLE_HEADERS = frozenset({"mcp-method", "mcp-name", "mcp-protocol-version"})


def check_repeated_headers(raw_headers: list[tuple[bytes, bytes]]) -> None:
    """-32020 when a header the body is checked against is repeated: with two values, the server
    (which reads the first) and a proxy or gateway (which may read the last) would disagree."""
    seen: set[str] = set()
    for raw_name, _value in raw_headers:
        name = raw_name.decode("latin-1").lower()
        if name not in _SINGLE_HEADERS and not name.startswith("mcp-param-"):
            continue
        if name in seen:
            raise McpError(HEADER_MISMATCH, f"Header mismatch: {_quote(name)} header is repeated")
        seen.add(name)


def _quote(value: str) -> str:
    return repr(value[:_QUOTE])


def check_meta(params: Any) -> RequestMeta:
    """The request's ``_meta``, or -32602 when it is missing or lacks a required member."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict):
        raise McpError(INVALID_PARAMS, "Invalid params: _meta with protocolVersion and clientCapabilities is required")
    try:
        return RequestMeta.model_validate(meta)
    except ValidationError as exc:
        raise McpError(INVALID_PARAMS, "Invalid params: malformed _meta", jsonrpc.validation_details(exc)) from None


def check_version(meta: RequestMeta) -> None:
    """-32022 with the supported versions when the requested one is not this era's."""
    if meta.protocol_version != era2026.VERSION:
        raise McpError(
            UNSUPPORTED_PROTOCOL_VERSION, f"Unsupported protocol version: {_quote(meta.protocol_version)}",
            {"supported": list(handlers.SUPPORTED_VERSIONS), "requested": meta.protocol_version[:_QUOTE]},
        )


def check_headers(headers: dict[str, str], method: str, params: Any, meta: RequestMeta) -> None:
    """SEP-2243: the headers must be present and repeat what the body says (-32020 otherwise)."""
    version = _ows(headers.get("mcp-protocol-version"))
    if version is None:
        raise McpError(HEADER_MISMATCH, "Header mismatch: MCP-Protocol-Version header is required")
    if version != meta.protocol_version:
        raise McpError(HEADER_MISMATCH, f"Header mismatch: MCP-Protocol-Version {_quote(version)} does not match _meta")
    sent_method = _ows(headers.get("mcp-method"))
    if sent_method is None:
        raise McpError(HEADER_MISMATCH, "Header mismatch: Mcp-Method header is required")
    if sent_method != method:
        raise McpError(HEADER_MISMATCH, f"Header mismatch: Mcp-Method {_quote(sent_method)} is not the body's method")
    source = NAME_SOURCE.get(method)
    if source is None:
        return
    value = params.get(source) if isinstance(params, dict) else None
    sent_name = _ows(headers.get("mcp-name"))
    if sent_name is None:
        if method in _NAME_OPTIONAL and conf.get().ERA2026_TASKS_NAME_OPTIONAL:
            return
        raise McpError(HEADER_MISMATCH, "Header mismatch: Mcp-Name header is required for " + method)
    if not isinstance(value, str) or header_value(sent_name) != value:
        raise McpError(HEADER_MISMATCH, f"Header mismatch: Mcp-Name does not match params.{source}")


_BASE64_WRAPPED = re.compile(r"^=\?base64\?(.*)\?=$", re.S)
_BASE64_STRICT = re.compile(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")


def header_value(raw: str) -> str:
    """An ``Mcp-Param-*`` value: ``=?base64?...?=`` is decoded (strictly), anything else is literal."""
    wrapped = _BASE64_WRAPPED.fullmatch(raw)
    if wrapped is None:
        return raw
    encoded = wrapped.group(1)
    if not _BASE64_STRICT.fullmatch(encoded):
        raise McpError(HEADER_MISMATCH, "Header mismatch: malformed Base64 in an Mcp-Param header")
    try:
        return base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise McpError(HEADER_MISMATCH, "Header mismatch: malformed Base64 in an Mcp-Param header") from None


def _as_header_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def check_param_headers(headers: dict[str, str], input_schema: dict[str, Any], arguments: Any) -> None:
    """SEP-2243 custom headers: an argument whose schema names ``x-mcp-header`` travels in
    ``Mcp-Param-<name>`` too, and the two must agree (-32020 when missing or different)."""
    properties = input_schema.get("properties")
    if not isinstance(properties, dict):
        return
    args = arguments if isinstance(arguments, dict) else {}
    for param, schema in properties.items():
        suffix = schema.get("x-mcp-header") if isinstance(schema, dict) else None
        if not isinstance(suffix, str):
            continue
        sent = headers.get("mcp-param-" + suffix.lower())
        if param not in args or args[param] is None:
            if sent is not None:
                raise McpError(HEADER_MISMATCH, f"Header mismatch: Mcp-Param-{suffix[:_QUOTE]} without the argument")
            continue
        if sent is None:
            raise McpError(HEADER_MISMATCH, f"Header mismatch: Mcp-Param-{suffix[:_QUOTE]} header is required")
        if header_value(sent) != _as_header_text(args[param]):
            raise McpError(HEADER_MISMATCH, f"Header mismatch: Mcp-Param-{suffix[:_QUOTE]} does not match the argument")


def _ows(value: str | None) -> str | None:
    # RFC 9110 §5.5: optional whitespace around a field value is not part of it.
    return value.strip(" \t") if value is not None else None


def status_for(err: McpError, *, meta_error: bool = False) -> int:
    """The HTTP status of a JSON-RPC error in this era."""
    if meta_error:
        return 400
    return _STATUS_BY_CODE.get(err.code, 200)


async def serve(consumer: McpConsumer, raw: Any, msg: Any) -> None:
    """Answer one 2026-07-28 POST (request, or a notification/response, which this era has no use for)."""
    if isinstance(msg, jsonrpc.JSONRPCNotification):
        await consumer._send_raw(202, b"", [])
        return
    if not isinstance(msg, jsonrpc.JSONRPCRequest):
        err = McpError(INVALID_REQUEST, "Invalid Request: this revision has no client responses")
        await consumer._send_json(400, jsonrpc.error_response(None, err))
        return
    rid = msg.id
    headers = consumer._headers()
    try:
        meta = check_meta(msg.params)
    except McpError as err:
        await consumer._send_json(400, jsonrpc.error_response(rid, err))
        return
    try:
        check_repeated_headers(consumer.scope.get("headers", []))
        check_headers(headers, msg.method, msg.params, meta)
        check_version(meta)
        if msg.method == "tools/call" and isinstance(msg.params, dict):
            tool = registry.get_tool(str(msg.params.get("name")))
            if tool is not None:
                check_param_headers(headers, tool.definition(with_execution=False)["inputSchema"],
                                    msg.params.get("arguments"))
        if handlers.dispatcher.route(msg.method) is None:
            raise McpError(METHOD_NOT_FOUND, f"Method not found: {msg.method[:_QUOTE]}")
    except McpError as err:
        await consumer._send_json(status_for(err), jsonrpc.error_response(rid, err))
        return
    auth = consumer.auth
    assert auth is not None
    ctx = EraContext(auth=auth, meta=meta, request_id=rid)
    scope, op_class = handlers.admission(ctx, msg.method, msg.params)
    if scope and not auth.has_scope(scope):
        await watch.arefused(auth=auth, action="auth.scope_refused", data={"method": msg.method[:64], "scope": scope})
        refusal = insufficient_scope(scope=scope, resource_url=consumer._resource_url())
        await consumer._send_json(refusal.status, {**refusal.body, "id": rid}, refusal.headers)
        return
    try:
        # The same per-class limits as the 2025-11-25 path (tasks/get polls count as reads).
        await sync_to_async(ratelimit.check_rate)(auth=auth, op_class=op_class)  # type: ignore[arg-type]
    except RateLimited as exc:
        await watch.arefused(auth=auth, action="ratelimit.refused",
                             data={"method": msg.method[:64], "class": exc.op_class, "limit": exc.limit})
        await consumer._refuse(rid, exc)
        return
    try:
        with observability.rpc_span(msg.method, msg.params, auth=auth, known=True) as span:
            result = await handlers.dispatcher.dispatch(ctx, msg.method, msg.params)
            observability.note_task(span, result)
    except UNAVAILABLE:
        raise  # answered (503) where every database outage is
    except McpError as err:
        await consumer._send_json(status_for(err), jsonrpc.error_response(rid, err))
        return
    except Exception as exc:
        if errors.rule_for(exc) is None:
            raise
        if isinstance(exc, QuotaExceeded):
            await watch.arefused(auth=auth, action="quota.refused",
                                 data={"method": msg.method[:64], "reason": exc.message[:200]})
        await consumer._refuse(rid, exc)
        return
    if isinstance(result, handlers.PlainRound):
        await _stream_round(consumer, rid, result)
        return
    if isinstance(result, handlers.ListenStream):
        await consumer.start_listen(result.listen)
        return
    await consumer._send_json(200, jsonrpc.response(rid, result))


async def _stream_round(consumer: McpConsumer, rid: str | int, round_: handlers.PlainRound) -> None:
    """Answer a plain call that asked for progress: SSE with its progress, then the response.

    The stream carries notifications and the one response only (never a server request). It is
    not resumable: a client that loses it retries the call.
    """
    await consumer.send_headers(status=200, headers=[
        (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform"),
        (b"x-accel-buffering", b"no"), *consumer.cors_headers,
    ])
    position = 0

    async def forward() -> None:
        nonlocal position
        notes, position = await sync_to_async(tasks.progress_since)(task=round_.task, after=position)
        for note in notes:
            await consumer.send_body(sse.event(json.dumps(note, separators=(",", ":"))), more_body=True)

    try:
        result = await round_.outcome(forward)
        await forward()
        message = jsonrpc.response(rid, result)
    except McpError as err:
        message = jsonrpc.error_response(rid, err)
    except UNAVAILABLE:
        message = jsonrpc.error_response(rid, McpError(INTERNAL_ERROR, "Service temporarily unavailable"))
    await consumer.send_body(sse.event(json.dumps(message, separators=(",", ":"))), more_body=False)
    consumer.responded = True
