"""JSON-RPC 2.0 message models and the parser that classifies an incoming body."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from mcptasks.protocol.errors import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, McpError, payload_too_large

RequestId = StrictStr | StrictInt


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    jsonrpc: Literal["2.0"]


class JSONRPCRequest(_Message):
    """A request: expects exactly one response with the same id."""

    id: RequestId
    method: StrictStr
    params: dict[str, Any] | None = None


class JSONRPCNotification(_Message):
    """A notification: no id, no response."""

    method: StrictStr
    params: dict[str, Any] | None = None


class JSONRPCResponse(_Message):
    """A successful response to a request."""

    id: RequestId
    result: dict[str, Any]


class ErrorObject(BaseModel):
    """The ``error`` member of an error response."""

    model_config = ConfigDict(extra="allow")
    code: StrictInt
    message: StrictStr
    data: Any = None


class JSONRPCError(_Message):
    """An error response; ``id`` is absent only when the request id could not be read."""

    id: RequestId | None = None
    error: ErrorObject


Message = JSONRPCRequest | JSONRPCNotification | JSONRPCResponse | JSONRPCError


#: Deepest nesting of arrays and objects a message may have (deeper: a parse error).
MAX_DEPTH = 64


def loads(body: bytes) -> Any:
    """Decode a body as UTF-8 JSON, raising -32700 on failure (including absurd nesting)."""
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise McpError(PARSE_ERROR, f"Parse error: {exc}") from None
    except RecursionError:
        raise McpError(PARSE_ERROR, f"Parse error: nested deeper than {MAX_DEPTH} levels") from None
    # Nesting needs an opening bracket per level: a body with few of them (every ordinary
    # request) cannot be too deep, and the walk is skipped.
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and _depth_exceeds(obj, MAX_DEPTH):
        raise McpError(PARSE_ERROR, f"Parse error: nested deeper than {MAX_DEPTH} levels")
    return obj


def _depth_exceeds(obj: Any, limit: int) -> bool:
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return False


def unstorable_string(obj: Any) -> str | None:
    """The first string (key or value) in ``obj`` that cannot be stored or sent as text, if any.

    NUL characters (PostgreSQL text refuses them) and unpaired surrogates (not encodable as
    UTF-8) are accepted by the JSON parser but would fail deep inside a write.
    """
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return "a NUL character"
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return "an unpaired surrogate"
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return None


def may_hold_unstorable(body: bytes) -> bool:
    """Whether the JSON text ``body`` can decode to a string that :func:`unstorable_string`
    refuses: only a ``\\u`` escape can make one (a raw NUL is not valid JSON, a raw lone
    surrogate not valid UTF-8), so a body without one needs no scan."""
    return b"\\u" in body


def parse_message(obj: Any, *, scan_strings: bool = True) -> Message:
    """Classify one decoded JSON-RPC message, raising -32600 if it is none of the four kinds.

    ``scan_strings=False`` skips the search for unstorable strings, for a message decoded from
    a body that :func:`may_hold_unstorable` cleared.
    """
    if isinstance(obj, list):
        raise McpError(INVALID_REQUEST, "Invalid Request: batches are not supported; send one message per POST")
    if not isinstance(obj, dict):
        raise McpError(INVALID_REQUEST, "Invalid Request: a JSON-RPC message must be an object")
    if obj.get("jsonrpc") != "2.0":
        raise McpError(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"')
    if scan_strings:
        bad = unstorable_string({k: v for k, v in obj.items() if k != "params"})
        if bad is not None:
            raise McpError(INVALID_REQUEST, f"Invalid Request: strings must not contain {bad}")
        bad = unstorable_string(obj.get("params"))
        if bad is not None:
            raise McpError(INVALID_PARAMS, f"Invalid params: strings must not contain {bad}")
    try:
        if "method" in obj:
            if "id" in obj:
                if obj["id"] is None:
                    raise McpError(INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
                return JSONRPCRequest.model_validate(obj)
            return JSONRPCNotification.model_validate(obj)
        if "result" in obj:
            return JSONRPCResponse.model_validate(obj)
        if "error" in obj:
            return JSONRPCError.model_validate(obj)
    except ValidationError as exc:
        raise McpError(INVALID_REQUEST, "Invalid Request", _errors(exc)) from None
    raise McpError(INVALID_REQUEST, "Invalid Request: not a request, notification or response")


def request_id_of(obj: Any) -> str | int | None:
    """Best-effort id of a malformed message, so its error response can still echo it."""
    if isinstance(obj, dict):
        rid = obj.get("id")
        if isinstance(rid, str | int) and not isinstance(rid, bool):
            return rid
    return None


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    # Only location and message: the raw input may be large or sensitive.
    return [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]


def validation_details(exc: ValidationError) -> list[dict[str, Any]]:
    """Public form of pydantic validation errors for a JSON-RPC ``data`` member."""
    return _errors(exc)


def response(rid: str | int, result: dict[str, Any]) -> dict[str, Any]:
    """Build a success response."""
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def error_response(rid: str | int | None, err: McpError) -> dict[str, Any]:
    """Build an error response (``id`` omitted when unknown, as the MCP schema wants)."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "error": err.to_error()}
    if rid is not None:
        msg["id"] = rid
    return msg


def notification(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build a notification."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def request(rid: str | int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build a request."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def with_id(message: dict[str, Any], rid: str | int | None) -> dict[str, Any]:
    """``message`` (an error response built without an id) as the answer to request ``rid``."""
    return {**message, "id": rid}


def encode(message: Any) -> str:
    """A message as compact JSON text: what every response body and SSE event of the server carries."""
    return json.dumps(message, separators=(",", ":"))


def payload_too_large_body(limit: int) -> bytes:
    """The JSON body of a 413 (no request id: the body was not read), wherever the limit is enforced."""
    return encode(error_response(None, payload_too_large(limit))).encode()
