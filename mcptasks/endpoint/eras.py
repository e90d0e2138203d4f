"""The 2026-07-28 side of the one MCP endpoint: era selection, header and ``_meta`` rules.

The consumer calls :func:`selects` on every parsed POST body and hands the request to
:func:`serve` when it belongs to this era: no ``Mcp-Session-Id``, not ``initialize``, and
either per-request ``_meta`` naming a protocol version or an ``MCP-Protocol-Version`` header
that no session-based revision has. Everything else is 2025-11-25 exactly as before.

:func:`serve` applies, in order: the ``_meta`` shape (-32602, HTTP 400), the protocol version
(-32022, HTTP 400), the SEP-2243 headers (-32020, HTTP 400; also when one of them is
repeated), the method table (-32601, HTTP 404), then the one admission pipeline both eras run
(:mod:`mcptasks.endpoint.admission`: scope, rate class, rate limits, fast polls), and
dispatches. The caller was authenticated before the body was read, as for every POST. It never
holds the consumer: it returns the reply to send (:mod:`mcptasks.endpoint.replies`), and the
HTTP statuses of its errors come from the one error table (:mod:`mcptasks.endpoint.errors`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import re
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from pydantic import ValidationError

from mcptasks import conf, observability
from mcptasks.endpoint import admission, errors
from mcptasks.endpoint.errors import ERA_2026, UNAVAILABLE
from mcptasks.endpoint.replies import JsonReply, ListenReply, Reply, SendFrame, SseReply
from mcptasks.methods import era2026 as handlers
from mcptasks.methods.era2026 import EraContext
from mcptasks.protocol import era2026, jsonrpc, sse, versions
from mcptasks.protocol.era2026 import META_PROTOCOL_VERSION, NAME_SOURCE, RequestMeta
from mcptasks.protocol.errors import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    UNSUPPORTED_PROTOCOL_VERSION,
    McpError,
)
from mcptasks.tasks import era2026 as tasks
from mcptasks.tools.registry import registry
from tenants.auth import AuthContext

logger = logging.getLogger(__name__)

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


async def serve(
    msg: Any, *, headers: dict[str, str], raw_headers: list[tuple[bytes, bytes]], auth: AuthContext,
    resource_url: Callable[[], str],
) -> Reply:
    """Answer one 2026-07-28 POST (request, or a notification/response, which this era has no use for).

    ``headers``: the request's headers by lower-case name (the first of repeated ones);
    ``raw_headers``: all of them as received; ``resource_url``: gives the protected resource a
    scope challenge names. Returns what the consumer is to send.
    """
    if isinstance(msg, jsonrpc.JSONRPCNotification):
        return JsonReply(202)
    if not isinstance(msg, jsonrpc.JSONRPCRequest):
        err = McpError(INVALID_REQUEST, "Invalid Request: this revision has no client responses")
        return JsonReply(400, jsonrpc.error_response(None, err))
    rid = msg.id
    try:
        meta = check_meta(msg.params)
    except McpError as err:
        # -32602 is a 200 elsewhere in this era; a missing or malformed _meta is a 400.
        return JsonReply(400, jsonrpc.error_response(rid, err))
    try:
        check_repeated_headers(raw_headers)
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
        return _error(rid, err)
    ctx = EraContext(auth=auth, meta=meta, request_id=rid)
    # The same pipeline as the session-based era: scope, rate class, rate limits, fast polls.
    admitted = await admission.admit(
        table=handlers.dispatcher, ctx=ctx, auth=auth, method=msg.method, params=msg.params, request_id=rid,
        resource_url=resource_url, era=ERA_2026,
    )
    if isinstance(admitted, JsonReply):
        return admitted
    try:
        with observability.rpc_span(msg.method, msg.params, auth=auth, known=True) as span:
            result = await handlers.dispatcher.dispatch(ctx, msg.method, msg.params,
                                                            passthrough=errors.PASSTHROUGH)
            observability.note_task(span, result)
    except UNAVAILABLE:
        raise  # answered (503) where every database outage is
    except Exception as exc:
        answered = await admission.failure(exc, auth=auth, method=msg.method, era=ERA_2026)
        if answered is None:
            raise
        error, status, extra = answered
        return JsonReply(status, jsonrpc.error_response(rid, error), extra)
    if isinstance(result, handlers.PlainRound):
        return SseReply(functools.partial(_stream_round, rid, result))
    if isinstance(result, handlers.ListenStream):
        return ListenReply(result.listen)
    return JsonReply(200, jsonrpc.response(rid, result))


def _error(rid: str | int, err: McpError) -> JsonReply:
    error, status, headers = errors.answer(err, era=ERA_2026)
    return JsonReply(status, jsonrpc.error_response(rid, error), headers)


async def _stream_round(rid: str | int, round_: handlers.PlainRound, send: SendFrame) -> bytes:
    """Answer a plain call that asked for progress: its progress, then the response (the last frame).

    The stream carries notifications and the one response only (never a server request). It is
    not resumable: a client that loses it retries the call.
    """
    position = 0

    async def forward() -> None:
        nonlocal position
        notes, position = await sync_to_async(tasks.progress_since)(task=round_.task, after=position)
        for note in notes:
            await send(sse.event(jsonrpc.encode(note)))

    try:
        result = await round_.outcome(forward)
        await forward()
        message = jsonrpc.response(rid, result)
    except McpError as err:
        message = jsonrpc.error_response(rid, err)
    except UNAVAILABLE:
        message = jsonrpc.error_response(rid, McpError(INTERNAL_ERROR, "Service temporarily unavailable"))
    return sse.event(jsonrpc.encode(message))
