"""parse_message / loads: classification of incoming bodies and every error they raise."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcptasks.protocol import jsonrpc
from mcptasks.protocol.errors import INVALID_REQUEST, PARSE_ERROR, McpError


def test_loads_valid_json() -> None:
    assert jsonrpc.loads(b'{"a": [1, 2]}') == {"a": [1, 2]}


@pytest.mark.parametrize("body", [b"", b"{", b"{'a': 1}", b"\xff\xfe", b"nul", b'{"a":1} trailing'])
def test_loads_parse_error(body: bytes) -> None:
    with pytest.raises(McpError) as exc:
        jsonrpc.loads(body)
    assert exc.value.code == PARSE_ERROR == -32700
    assert exc.value.message.startswith("Parse error")


def test_classifies_the_four_kinds() -> None:
    req = jsonrpc.parse_message({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert isinstance(req, jsonrpc.JSONRPCRequest) and req.id == 1 and req.params is None
    req = jsonrpc.parse_message({"jsonrpc": "2.0", "id": "x", "method": "m", "params": {"a": 1}})
    assert isinstance(req, jsonrpc.JSONRPCRequest) and req.id == "x" and req.params == {"a": 1}
    note = jsonrpc.parse_message({"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert isinstance(note, jsonrpc.JSONRPCNotification)
    resp = jsonrpc.parse_message({"jsonrpc": "2.0", "id": "s1", "result": {}})
    assert isinstance(resp, jsonrpc.JSONRPCResponse) and resp.result == {}
    err = jsonrpc.parse_message({"jsonrpc": "2.0", "id": "s1", "error": {"code": -1, "message": "no"}})
    assert isinstance(err, jsonrpc.JSONRPCError) and err.error.code == -1
    err = jsonrpc.parse_message({"jsonrpc": "2.0", "error": {"code": -1, "message": "no"}})
    assert isinstance(err, jsonrpc.JSONRPCError) and err.id is None


def test_unknown_members_are_tolerated() -> None:
    req = jsonrpc.parse_message({"jsonrpc": "2.0", "id": 1, "method": "ping", "extra": True})
    assert isinstance(req, jsonrpc.JSONRPCRequest)


@pytest.mark.parametrize(
    "obj",
    [
        [{"jsonrpc": "2.0", "id": 1, "method": "ping"}],  # batch
        [],  # empty batch
        "ping",
        42,
        None,
        {"jsonrpc": "1.0", "id": 1, "method": "ping"},
        {"id": 1, "method": "ping"},
        {"jsonrpc": 2.0, "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "id": None, "method": "ping"},
        {"jsonrpc": "2.0", "id": 1.5, "method": "ping"},
        {"jsonrpc": "2.0", "id": True, "method": "ping"},
        {"jsonrpc": "2.0", "id": [1], "method": "ping"},
        {"jsonrpc": "2.0", "id": 1, "method": 7},
        {"jsonrpc": "2.0", "id": 1, "method": "m", "params": [1, 2]},
        {"jsonrpc": "2.0", "method": "m", "params": "x"},
        {"jsonrpc": "2.0", "id": 1, "result": "not an object"},
        {"jsonrpc": "2.0", "id": 1, "error": {"code": "x", "message": "m"}},
        {"jsonrpc": "2.0", "id": 1, "error": {"message": "no code"}},
        {"jsonrpc": "2.0", "id": 1},
        {"jsonrpc": "2.0"},
    ],
)
def test_invalid_requests(obj: Any) -> None:
    with pytest.raises(McpError) as exc:
        jsonrpc.parse_message(obj)
    assert exc.value.code == INVALID_REQUEST == -32600
    assert exc.value.message.startswith("Invalid Request")


def test_batches_are_refused_with_a_reason() -> None:
    with pytest.raises(McpError) as exc:
        jsonrpc.parse_message([{"jsonrpc": "2.0", "method": "x"}])
    assert "batch" in exc.value.message


def test_validation_data_has_no_raw_input() -> None:
    secret = "s3cr3t-value"
    with pytest.raises(McpError) as exc:
        jsonrpc.parse_message({"jsonrpc": "2.0", "id": 1, "method": "m", "params": secret})
    assert exc.value.data and all(set(d) == {"loc", "msg"} for d in exc.value.data)
    assert secret not in repr(exc.value.data)


@pytest.mark.parametrize(
    ("obj", "rid"),
    [({"id": 3}, 3), ({"id": "a"}, "a"), ({"id": True}, None), ({"id": None}, None), ([], None), ({}, None),
     ({"id": 1.5}, None)],
)
def test_request_id_of(obj: Any, rid: Any) -> None:
    assert jsonrpc.request_id_of(obj) == rid


def test_builders() -> None:
    assert jsonrpc.response(1, {}) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    err = McpError(-32601, "Method not found: x", {"k": 1})
    assert jsonrpc.error_response(1, err) == {
        "jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "Method not found: x", "data": {"k": 1}}
    }
    # No id at all (not null) when it is unknown, as the 2025-11-25 schema wants.
    assert jsonrpc.error_response(None, McpError(-32700, "Parse error")) == {
        "jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}
    }
    assert jsonrpc.notification("n") == {"jsonrpc": "2.0", "method": "n"}
    assert jsonrpc.notification("n", {"a": 1}) == {"jsonrpc": "2.0", "method": "n", "params": {"a": 1}}
    assert jsonrpc.request("r1", "ping") == {"jsonrpc": "2.0", "id": "r1", "method": "ping"}


def test_mcp_error_roundtrip() -> None:
    err = McpError(-32602, "bad", [1])
    again = McpError.from_error(err.to_error())
    assert (again.code, again.message, again.data) == (-32602, "bad", [1])
    assert McpError.from_error({}).code == -32603
    assert "bad" in repr(err)


_any_text = st.text(alphabet=st.characters(exclude_categories=()))  # NULs and lone surrogates too


@given(st.recursive(
    _any_text | st.integers() | st.none(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_any_text, children, max_size=4),
    max_leaves=12,
), st.booleans())
def test_bodies_without_u_escapes_hold_no_unstorable_strings(value: object, ascii_only: bool) -> None:
    """The consumer skips the string scan for bodies without a \\u escape: that must never let
    a NUL or a lone surrogate through, however the client encoded its JSON."""
    text = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"v": value}}, ensure_ascii=ascii_only)
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError:
        return  # a raw lone surrogate is not UTF-8: such a body never decodes
    obj = jsonrpc.loads(body)
    if jsonrpc.unstorable_string(obj) is not None:
        assert jsonrpc.may_hold_unstorable(body)


def test_deep_nesting_is_still_refused_with_the_bracket_shortcut() -> None:
    deep = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":' + b"[" * 70 + b"]" * 70 + b"}}"
    with pytest.raises(McpError) as exc:
        jsonrpc.loads(deep)
    assert "nested deeper" in exc.value.message
    shallow = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":' + b"[" * 10 + b"]" * 10 + b"}}"
    assert jsonrpc.loads(shallow)["params"]["a"] == [[[[[[[[[[]]]]]]]]]]
