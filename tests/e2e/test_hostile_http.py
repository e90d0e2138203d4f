"""Hostile requests over real HTTP (daphne + worker): never a 500, never a handler crash.

Hypothesis generates bodies (arbitrary bytes, invalid UTF-8, deep nesting, JSON-RPC messages
whose every string field may hold NUL characters or lone surrogates), headers and methods.
Each answer must be a clear HTTP or JSON-RPC error (or a proper result), never HTTP 5xx nor
``-32603`` (a handler that crashed), and the tasks stored before the storm must be unchanged
after it. The attacker is another principal of the same tenant, who knows the task ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.client import ACCEPT_BOTH, McpClient
from tests.support.servers import Proc, Stack

#: What a hostile request may get back: a result, or a clear protocol error.
CLEAR_CODES = {-32700, -32600, -32601, -32602, -32001, -32002, -32042}
FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class Target:
    """The server, a victim's stored tasks, and an attacker's session."""

    def __init__(self, server: Proc, stack: Stack) -> None:
        self.url = server.url
        self.victim = McpClient(server.url, token=stack.token("fuzzco", "victim"), timeout=30)
        self.victim.initialize()
        self.task_ids = []
        for args in ({"ms": 5}, {"ms": 10}):
            task = self.victim.call_task("demo_sleep", args)
            self.victim.request("tasks/result", {"taskId": task["taskId"]})
            self.task_ids.append(task["taskId"])
        failed = self.victim.call_task("demo_fail", {"message": "stored failure"})
        self.victim.request("tasks/result", {"taskId": failed["taskId"]})
        self.task_ids.append(failed["taskId"])
        self.before = self.snapshot()
        self.token = stack.token("fuzzco", "mallory", scopes="mcp:tools mcp:tasks")
        attacker = McpClient(server.url, token=self.token)
        attacker.initialize()
        self.session_id = attacker.session_id or ""
        attacker.close()
        self.http = httpx.Client(timeout=30)

    def snapshot(self) -> list[Any]:
        """Everything the victim can see of its tasks: status, times, results."""
        out: list[Any] = []
        for tid in self.task_ids:
            out.append(self.victim.request("tasks/get", {"taskId": tid}).result)
            reply = self.victim.request("tasks/result", {"taskId": tid}).message or {}
            out.append({k: v for k, v in reply.items() if k != "id"})
        listing = self.victim.request("tasks/list", {}).result
        out.append(sorted(t["taskId"] for t in listing["tasks"]))
        return out

    def headers(self, **extra: str) -> dict[str, str]:
        h = {
            "Accept": ACCEPT_BOTH,
            "Content-Type": "application/json",
            "Authorization": f"Bearer {self.token}",
            "Mcp-Session-Id": self.session_id,
            "MCP-Protocol-Version": "2025-11-25",
        }
        h.update(extra)
        return h

    def send(self, method: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
        """Send one request; read a JSON answer whole, an SSE answer only up to its first whole message.

        A GET that is accepted opens the session's standalone stream, which stays open (priming
        event, then keep-alives): it is read only up to its priming event.
        """
        with self.http.stream(method, self.url, content=body, headers=headers) as resp:
            content_type = resp.headers.get("content-type", "")
            sse = content_type.startswith("text/event-stream")
            data = b""
            for chunk in resp.iter_bytes():
                data += chunk
                if sse and (_first_message_complete(data) or (method != "POST" and b"\n\n" in data)):
                    break
                if len(data) > 1_000_000:
                    break
            return resp.status_code, content_type, data


def _first_message_complete(data: bytes) -> bool:
    """Whether the SSE bytes so far hold a whole event carrying a JSON message.

    A message can span many reads (a 70,000-character request id is echoed back), so stopping at
    the first ``data: {`` would cut it short.
    """
    start = data.find(b"data: {")
    return start >= 0 and data.find(b"\n\n", start) >= 0


def check(status: int, content_type: str, body: bytes) -> None:
    """The property every answer satisfies."""
    assert status < 500, (status, body[:300])
    assert b"Traceback" not in body
    texts: list[str] = []
    if content_type.startswith("application/json") and body:
        texts = [body.decode()]
    elif content_type.startswith("text/event-stream"):
        texts = [line[6:] for line in body.decode(errors="replace").splitlines() if line.startswith("data: {")]
    for text in texts:
        message = json.loads(text)
        for item in message if isinstance(message, list) else [message]:
            if "error" in item:
                assert item["error"]["code"] in CLEAR_CODES, item
                assert isinstance(item["error"]["message"], str) and item["error"]["message"]


@pytest.fixture(scope="module")
def target(server: Proc, stack: Stack) -> Iterator[Target]:
    t = Target(server, stack)
    yield t
    # Stored tasks are unchanged by everything the attacker sent.
    assert t.snapshot() == t.before
    # And the server still serves.
    assert t.victim.request("ping", {}).result == {}
    t.victim.close()
    t.http.close()


# --- strategies ------------------------------------------------------------------------------

#: Strings a careless parser or database chokes on.
nasty_pieces = st.sampled_from(["\x00", "\ud800", "\udfff", "a\udc80b", "\u2028", "\ufeff", "%00", "'", "\\", ""])
nasty_text = st.one_of(
    st.text(max_size=12),
    nasty_pieces,
    st.builds(lambda a, b, c: a + b + c, st.text(max_size=4), nasty_pieces, st.text(max_size=4)),
    st.sampled_from(["x" * 300, "t" * 70_000]),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), nasty_text),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(nasty_text, inner, max_size=4)
    ),
    max_leaves=10,
)
tool_names = st.one_of(st.sampled_from(["demo_quick", "demo_fail", "demo_crash"]), nasty_text)


def _params(target_ids: list[str]) -> st.SearchStrategy[tuple[str, Any]]:
    """(method, params) shaped like real requests, with hostile values in every field."""
    task_id = st.one_of(st.sampled_from(target_ids), nasty_text, json_values)
    maybe = st.one_of(nasty_text, json_values)
    return st.one_of(
        st.tuples(st.just("tools/call"), st.fixed_dictionaries(
            {"name": tool_names},
            optional={"arguments": st.one_of(st.dictionaries(nasty_text, json_values, max_size=3), maybe),
                      "task": st.one_of(st.fixed_dictionaries({}, optional={"ttl": json_values}), maybe),
                      "_meta": st.one_of(st.fixed_dictionaries({"progressToken": maybe}), maybe)})),
        st.tuples(st.sampled_from(["tasks/get", "tasks/result", "tasks/cancel"]),
                  st.fixed_dictionaries({"taskId": task_id}, optional={"_meta": maybe})),
        st.tuples(st.just("tasks/list"), st.fixed_dictionaries({}, optional={"cursor": maybe})),
        st.tuples(st.just("resources/read"), st.fixed_dictionaries({"uri": maybe})),
        st.tuples(st.just("resources/subscribe"), st.fixed_dictionaries({"uri": maybe})),
        st.tuples(st.just("prompts/get"), st.fixed_dictionaries({"name": maybe}, optional={"arguments": maybe})),
        st.tuples(st.just("completion/complete"), st.fixed_dictionaries({"ref": maybe, "argument": maybe})),
        st.tuples(st.just("logging/setLevel"), st.fixed_dictionaries({"level": maybe})),
        st.tuples(st.just("initialize"), st.fixed_dictionaries(
            {"protocolVersion": maybe, "capabilities": maybe, "clientInfo": maybe})),
        st.tuples(st.one_of(nasty_text, st.sampled_from(["ping", "tools/list", "prompts/list"])), maybe),
    )


def _encode(message: Any) -> bytes:
    # ensure_ascii: lone surrogates travel as \\udXXX escapes, as a hostile client would send them.
    return json.dumps(message, ensure_ascii=True).encode()


# --- properties ------------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_hostile_json_rpc_messages(target: Target, data: st.DataObject) -> None:
    method, params = data.draw(_params(target.task_ids))
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": data.draw(st.one_of(st.integers(), nasty_text)),
                               "method": method}
    if params is not None or data.draw(st.booleans()):
        message["params"] = params
    check(*target.send("POST", _encode(message), target.headers()))


@FUZZ
@given(body=st.one_of(
    st.binary(max_size=300),
    # Valid JSON-RPC with invalid UTF-8 inside a string.
    st.builds(lambda junk: b'{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"' + junk + b'"}}',
              st.binary(min_size=1, max_size=8).filter(lambda b: not _is_utf8(b))),
    st.builds(lambda junk: b'{"jsonrpc":"2.0","id":1,"method":"' + junk + b'"}',
              st.binary(min_size=1, max_size=8).filter(lambda b: not _is_utf8(b))),
    st.builds(lambda n, open_, close: (open_ * n + close * n).encode(),
              st.integers(1, 200_000), st.sampled_from(["[", '{"a":']), st.sampled_from(["]", "}"])),
    st.builds(lambda n: ('{"jsonrpc":"2.0","id":1,"method":"ping","params":' + "[" * n + "]" * n + "}").encode(),
              st.integers(50, 100_000)),
))
def test_hostile_bodies(target: Target, body: bytes) -> None:
    check(*target.send("POST", body, target.headers()))


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]),
    header=st.sampled_from(["Accept", "Content-Type", "MCP-Protocol-Version", "Mcp-Session-Id", "Last-Event-ID",
                            "Origin", "Authorization", "Content-Encoding"]),
    value=st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60),
)
def test_hostile_headers_and_methods(target: Target, method: str, header: str, value: str) -> None:
    body = _encode({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": target.task_ids[0]}})
    headers = target.headers(**{header: value.strip()})  # HTTP/1.1 cannot carry edge whitespace
    check(*target.send(method, body if method in ("POST", "PUT", "PATCH") else b"", headers))


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
