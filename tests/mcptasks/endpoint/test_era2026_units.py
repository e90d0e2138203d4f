"""Units of the 2026-07-28 adapter: signed requestState, header decoding, custom headers, worker slots."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from django.core import signing

from mcptasks.endpoint.eras import check_param_headers, header_value, selects
from mcptasks.methods import request_state as state
from mcptasks.protocol.errors import HEADER_MISMATCH, INVALID_PARAMS, McpError
from mcptasks.worker.loop import WAITING_FACTOR, Worker
from tenants.auth import AuthContext


def auth(tenant: int = 1, principal: int = 1) -> AuthContext:
    return AuthContext(tenant_id=tenant, tenant_slug="t", principal_id=principal, principal_name="p")


def test_request_state_round_trips_for_its_caller_and_tool() -> None:
    token = state.issue(auth=auth(), task_id="abc", tool="tool", round_=2)
    assert state.verify(auth=auth(), state=token, tool="tool") == state.RoundState("abc", "tool", 2)
    assert token != state.issue(auth=auth(), task_id="abc", tool="tool", round_=2)  # a nonce per round


@pytest.mark.parametrize("who", [auth(tenant=2), auth(principal=2)])
def test_request_state_of_someone_else_fails_like_a_forged_one(who: AuthContext) -> None:
    token = state.issue(auth=auth(), task_id="abc", tool="tool", round_=1)
    with pytest.raises(McpError) as stolen:
        state.verify(auth=who, state=token, tool="tool")
    with pytest.raises(McpError) as forged:
        state.verify(auth=auth(), state=token[:-3] + "AAA", tool="tool")
    with pytest.raises(McpError) as other_tool:
        state.verify(auth=auth(), state=token, tool="other")
    assert stolen.value.code == forged.value.code == other_tool.value.code == INVALID_PARAMS
    assert stolen.value.message == forged.value.message == other_tool.value.message


def test_request_state_signed_with_another_salt_or_too_old_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    foreign = signing.dumps({"t": "abc", "n": "tool", "r": 1, "tn": 1, "p": 1}, salt="mcptasks.list")
    with pytest.raises(McpError):
        state.verify(auth=auth(), state=foreign, tool="tool")
    token = state.issue(auth=auth(), task_id="abc", tool="tool", round_=1)
    monkeypatch.setattr(state, "MAX_AGE_S", -1)
    with pytest.raises(McpError):
        state.verify(auth=auth(), state=token, tool="tool")


def test_header_values_decode_strict_base64_and_keep_everything_else_literal() -> None:
    encoded = base64.b64encode(b"Hello").decode()
    assert header_value(f"=?base64?{encoded}?=") == "Hello"
    assert header_value(encoded) == encoded
    assert header_value(f"=?base64?{encoded}") == f"=?base64?{encoded}"
    for bad in ("=?base64?SGVsbG8?=", "=?base64?SGVs!!!bG8=?=", "=?base64?/w==?="):
        with pytest.raises(McpError) as refused:
            header_value(bad)
        assert refused.value.code == HEADER_MISMATCH


SCHEMA = {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"},
                                           "n": {"type": "integer", "x-mcp-header": "N"}, "q": {"type": "string"}}}


@pytest.mark.parametrize(("headers", "args", "ok"), [
    ({"mcp-param-region": "eu", "mcp-param-n": "3"}, {"region": "eu", "n": 3, "q": "x"}, True),
    ({"mcp-param-region": "=?base64?ZXU=?="}, {"region": "eu"}, True),
    ({}, {"q": "x"}, True),
    ({}, {"region": "eu"}, False),  # value in the body, header omitted
    ({"mcp-param-region": "us"}, {"region": "eu"}, False),
    ({"mcp-param-region": "eu"}, {}, False),  # header without the argument
    ({"mcp-param-region": "eu", "mcp-param-n": "4"}, {"region": "eu", "n": 3}, False),
])
def test_custom_headers_must_agree_with_the_arguments(headers: dict[str, str], args: dict[str, Any], ok: bool) -> None:
    if ok:
        check_param_headers(headers, SCHEMA, args)
    else:
        with pytest.raises(McpError) as refused:
            check_param_headers(headers, SCHEMA, args)
        assert refused.value.code == HEADER_MISMATCH


def test_era_selection() -> None:
    meta = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}
    assert selects({}, {"method": "tools/list", "params": meta})
    assert selects({}, {"method": "initialize", "params": meta})
    assert not selects({"mcp-session-id": "s"}, {"method": "tools/list", "params": meta})
    assert not selects({}, {"method": "initialize", "params": {}})
    assert not selects({"mcp-protocol-version": "2025-11-25"}, {"method": "tools/list"})
    assert selects({"mcp-protocol-version": "2026-07-28"}, {"method": "tools/list"})
    assert selects({"mcp-protocol-version": "v999"}, {"method": "tools/list"})
    assert not selects({"mcp-protocol-version": "v999"}, {"method": "initialize"})
    assert not selects({}, [1, 2])


class _Backend:
    def __init__(self, waiting: int) -> None:
        self.awaiting_client = waiting
        self.finishing = False


def test_runs_waiting_for_their_client_free_worker_slots() -> None:
    worker = Worker.__new__(Worker)
    worker.concurrency = 2
    loop_task: Any = asyncio.Future
    worker.running = {"a": (loop_task, _Backend(0), 1), "b": (loop_task, _Backend(1), 1)}
    assert worker._free_slots() == 1  # one busy run, one waiting for its client
    worker.running = {str(i): (loop_task, _Backend(1), 1) for i in range(2 * WAITING_FACTOR)}
    assert worker._free_slots() == 0  # waiting runs are bounded too
    worker.running = {str(i): (loop_task, _Backend(0), 1) for i in range(2)}
    assert worker._free_slots() == 0
