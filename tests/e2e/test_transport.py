"""Streamable HTTP transport rules, checked with raw HTTP (httpx) against a real daphne process.

Every message the server sends is validated against the official 2025-11-25 schema.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.client import ACCEPT_BOTH, McpClient, SseEvent, iter_sse
from tests.support.schema import validate_server_message
from tests.support.servers import Proc, Stack

LATEST = "2025-11-25"
TRACEBACK_MARKERS = ("Traceback", "secret-crash-detail", 'File "', "RuntimeError")


# --- helpers ---------------------------------------------------------------------------------


def init_body(version: str = LATEST, capabilities: dict[str, Any] | None = None, rid: Any = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": capabilities if capabilities is not None else {"elicitation": {}, "sampling": {}},
            "clientInfo": {"name": "raw-transport-test", "version": "1"},
        },
    }


def hdrs(session: str | None = None, version: str | None = LATEST, **extra: str) -> dict[str, str]:
    h = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json"}
    if session:
        h["Mcp-Session-Id"] = session
        if version:
            h["MCP-Protocol-Version"] = version
    h.update(extra)
    return h


def json_message(resp: httpx.Response, method: str | None = None) -> dict[str, Any]:
    """The JSON-RPC message of a JSON response, schema-validated."""
    assert resp.headers["content-type"].startswith("application/json"), (resp.status_code, resp.text)
    msg = resp.json()
    validate_server_message(msg, method)
    return msg  # type: ignore[no-any-return]


def assert_error_body(resp: httpx.Response, status: int, code: int | None = None) -> dict[str, Any]:
    """An HTTP refusal: the expected status with a JSON-RPC error body (never bare, never HTML)."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    msg = json_message(resp)
    assert "error" in msg and isinstance(msg["error"]["message"], str) and msg["error"]["message"]
    if code is not None:
        assert msg["error"]["code"] == code, msg
    assert "<html" not in resp.text.lower()
    return msg


def open_session(url: str, version: str = LATEST, capabilities: dict[str, Any] | None = None) -> tuple[str, dict]:
    resp = httpx.post(url, json=init_body(version, capabilities), headers=hdrs(), timeout=10)
    assert resp.status_code == 200, resp.text
    msg = json_message(resp, "initialize")
    sid = resp.headers["mcp-session-id"]
    ok = httpx.post(
        url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
        headers=hdrs(sid, msg["result"]["protocolVersion"]), timeout=10,
    )
    assert ok.status_code == 202 and ok.content == b""
    return sid, msg["result"]


def sse_events(resp: httpx.Response, method: str | None = None, *, stop_at_response: bool = True,
               deadline_s: float = 20) -> Iterator[SseEvent | str]:
    """Parse (and schema-validate) an SSE response; comments are yielded as strings."""
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream"), resp.headers
    end = time.monotonic() + deadline_s
    for item in iter_sse(resp.iter_lines()):
        assert time.monotonic() < end, "SSE stream took too long"
        if isinstance(item, SseEvent) and item.message is not None:
            msg = item.message
            validate_server_message(msg, method if "method" not in msg else None)
        yield item
        if stop_at_response and isinstance(item, SseEvent) and item.message and "method" not in item.message:
            return


@pytest.fixture(scope="module")
def sid(server: Proc) -> str:
    return open_session(server.url)[0]


@pytest.fixture(scope="module")
def tuned(stack: Stack) -> Iterator[Proc]:
    """A second daphne with a fast keep-alive, a small body limit and one allowed foreign Origin."""
    proc = stack.daphne(
        embedded_worker=False,
        extra_env={
            "MCPTASKS_SSE_KEEPALIVE_S": "0.3",
            "MCPTASKS_MAX_BODY_BYTES": "2048",
            "MCPTASKS_ALLOWED_ORIGINS": "https://app.example.com",
        },
    )
    yield proc
    proc.terminate(timeout=10)


# --- sessions ----------------------------------------------------------------------------------


def test_initialize_assigns_a_random_visible_ascii_session_id(server: Proc) -> None:
    ids = set()
    for _ in range(3):
        resp = httpx.post(server.url, json=init_body(), headers=hdrs(), timeout=10)
        assert resp.status_code == 200
        msg = json_message(resp, "initialize")
        assert msg["id"] == 1
        sid = resp.headers["mcp-session-id"]
        assert re.fullmatch(r"[\x21-\x7e]+", sid), sid
        # token_urlsafe alphabet: 6 bits per character; at least 128 bits of randomness.
        assert re.fullmatch(r"[A-Za-z0-9_-]+", sid) and len(sid) * 6 >= 128, sid
        ids.add(sid)
    assert len(ids) == 3


def test_session_id_required_after_initialize_and_unknown_is_404(server: Proc, sid: str) -> None:
    ping = {"jsonrpc": "2.0", "id": 7, "method": "ping"}
    assert_error_body(httpx.post(server.url, json=ping, headers=hdrs(), timeout=10), 400)
    assert_error_body(httpx.post(server.url, json=ping, headers=hdrs("no-such-session"), timeout=10), 404)
    ok = httpx.post(server.url, json=ping, headers=hdrs(sid), timeout=10)
    assert ok.status_code == 200 and json_message(ok, "ping") == {"jsonrpc": "2.0", "id": 7, "result": {}}
    # GET and DELETE need it too.
    assert_error_body(httpx.get(server.url, headers={"Accept": "text/event-stream"}, timeout=10), 400)
    assert_error_body(httpx.delete(server.url, headers=hdrs(), timeout=10), 400)


def test_delete_ends_the_session_then_everything_is_404(server: Proc) -> None:
    sid, _ = open_session(server.url)
    # An open GET stream of the session ends when the session is deleted.
    with httpx.Client(timeout=10) as http:
        with http.stream("GET", server.url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid}) as get:
            events = sse_events(get, stop_at_response=False)
            first = next(events)
            assert isinstance(first, SseEvent) and first.id and first.data == ""
            resp = httpx.delete(server.url, headers=hdrs(sid), timeout=10)
            assert resp.status_code in (200, 202, 204), resp.text
            rest = [e for e in events if isinstance(e, SseEvent)]  # returns when the server ends the stream
            assert rest == []
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert_error_body(httpx.post(server.url, json=ping, headers=hdrs(sid), timeout=10), 404)
    notif = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert_error_body(httpx.post(server.url, json=notif, headers=hdrs(sid), timeout=10), 404)
    assert_error_body(
        httpx.get(server.url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid}, timeout=10), 404
    )
    assert_error_body(httpx.delete(server.url, headers=hdrs(sid), timeout=10), 404)


# --- POST rules --------------------------------------------------------------------------------


@pytest.mark.parametrize("accept", ["application/json", "text/event-stream", "", "text/html"])
def test_post_accept_must_list_json_and_sse(server: Proc, sid: str, accept: str) -> None:
    # An empty value is sent as such (httpx would otherwise add its default "*/*").
    resp = httpx.post(server.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                      headers=hdrs(sid, Accept=accept), timeout=10)
    assert_error_body(resp, 406)


@pytest.mark.parametrize("accept", ["text/event-stream, application/json", "application/json;q=0.9,text/event-stream"])
def test_post_accept_is_parsed_as_a_list(server: Proc, sid: str, accept: str) -> None:
    resp = httpx.post(
        server.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=hdrs(sid, Accept=accept), timeout=10
    )
    assert resp.status_code == 200 and json_message(resp, "ping")["result"] == {}


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_post_content_type_must_be_json(server: Proc, sid: str, ctype: str) -> None:
    h = hdrs(sid)
    if ctype:
        h["Content-Type"] = ctype
    else:
        del h["Content-Type"]
    resp = httpx.post(server.url, content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}', headers=h, timeout=10)
    assert_error_body(resp, 415)
    with_charset = httpx.post(
        server.url, content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
        headers=hdrs(sid, **{"Content-Type": "application/json; charset=utf-8"}), timeout=10,
    )
    assert with_charset.status_code == 200


def test_notification_is_202_with_empty_body(server: Proc, sid: str) -> None:
    for body in (
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 999, "reason": "x"}},
    ):
        resp = httpx.post(server.url, json=body, headers=hdrs(sid), timeout=10)
        assert resp.status_code == 202 and resp.content == b"", (body, resp.text)


def test_request_answered_with_json_or_sse(server: Proc, sid: str) -> None:
    resp = httpx.post(server.url, json={"jsonrpc": "2.0", "id": "a", "method": "tools/list"}, headers=hdrs(sid),
                      timeout=10)
    assert resp.status_code == 200
    assert json_message(resp, "tools/list")["id"] == "a"
    # A tool call that sends log notifications before its response streams them as SSE.
    body = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "test_tool_with_logging"}}
    with httpx.stream("POST", server.url, json=body, headers=hdrs(sid), timeout=20) as stream:
        events = [e for e in sse_events(stream, "tools/call") if isinstance(e, SseEvent)]
    msgs = [e.message for e in events if e.message]
    assert [m["method"] for m in msgs[:-1]] == ["notifications/message"] * 3
    assert msgs[-1]["id"] == 5 and msgs[-1]["result"]["content"][0]["text"] == "Tool with logging executed successfully"


def test_client_response_is_202_with_empty_body(server: Proc) -> None:
    sid, _ = open_session(server.url)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "test_elicitation", "arguments": {"message": "Who?"}}}
    with httpx.Client(timeout=20) as http, http.stream("POST", server.url, json=body, headers=hdrs(sid)) as stream:
        final = None
        for ev in sse_events(stream, "tools/call"):
            if not isinstance(ev, SseEvent) or ev.message is None:
                continue
            msg = ev.message
            if msg.get("method") == "elicitation/create":
                answer = {"jsonrpc": "2.0", "id": msg["id"],
                          "result": {"action": "accept", "content": {"username": "u", "email": "e@x.org"}}}
                resp = http.post(server.url, json=answer, headers=hdrs(sid))
                assert resp.status_code == 202 and resp.content == b""
                # A duplicate answer is accepted and ignored (the first one counts).
                again = http.post(server.url, json=answer, headers=hdrs(sid))
                assert again.status_code == 202 and again.content == b""
                # An answer to a request the server never sent is refused.
                stray = http.post(server.url, json={**answer, "id": "mcpt-unknown"}, headers=hdrs(sid))
                assert_error_body(stray, 400)
            elif "method" not in msg:
                final = msg
    assert final is not None and final["id"] == 1
    assert final["result"]["content"][0]["text"].startswith("User response: action=accept")


# --- SSE framing -------------------------------------------------------------------------------


def test_sse_priming_event_retry_and_unique_event_ids(server: Proc) -> None:
    sid, _ = open_session(server.url)
    seen_ids: list[str] = []
    with httpx.Client(timeout=20) as http:
        # The standalone GET stream starts with its own priming event.
        with http.stream("GET", server.url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid,
                                                     "MCP-Protocol-Version": LATEST}) as get:
            first = next(sse_events(get, stop_at_response=False))
            assert isinstance(first, SseEvent) and first.id and first.data == "" and first.retry is not None
            seen_ids.append(first.id)
        for rid in (1, 2, 3):
            body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                    "params": {"name": "test_tool_with_progress", "_meta": {"progressToken": rid}}}
            with http.stream("POST", server.url, json=body, headers=hdrs(sid)) as post:
                raw_first = b""
                events: list[SseEvent] = []
                for ev in sse_events(post, "tools/call"):
                    if isinstance(ev, SseEvent):
                        events.append(ev)
            priming = events[0]
            assert priming.id and priming.data == "" and priming.retry is not None and priming.retry > 0
            assert all(e.id for e in events), "every event carries an id"
            assert events[-1].message is not None and events[-1].message["id"] == rid
            assert sum(1 for e in events if e.message and e.message.get("method") == "notifications/progress") == 3
            seen_ids.extend(e.id for e in events if e.id)
            del raw_first
    assert len(seen_ids) == len(set(seen_ids)), seen_ids


def test_sse_wire_format_of_priming_event(server: Proc, sid: str) -> None:
    body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "test_simple_text"}}
    with httpx.stream("POST", server.url, json=body, headers=hdrs(sid), timeout=20) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert "no-cache" in resp.headers.get("cache-control", "")
        raw = resp.read().decode()
    first_block = raw.split("\n\n", 1)[0].split("\n")
    assert first_block[0].startswith("id: ") and len(first_block[0]) > 4
    assert re.fullmatch(r"retry: \d+", first_block[1]), first_block
    assert first_block[2] in ("data: ", "data:")
    last = [b for b in raw.split("\n\n") if b.strip()][-1]
    data = json.loads(next(line[6:] for line in last.split("\n") if line.startswith("data: ")))
    validate_server_message(data, "tools/call")
    assert data["result"]["content"] == [{"type": "text", "text": "This is a simple text response for testing."}]


def test_keepalive_comments_on_idle_get_stream(tuned: Proc) -> None:
    sid, _ = open_session(tuned.url)
    comments: list[str] = []
    started = time.monotonic()
    with httpx.stream("GET", tuned.url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid},
                      timeout=10) as get:
        for item in sse_events(get, stop_at_response=False, deadline_s=8):
            if isinstance(item, str):
                comments.append(item)
                if len(comments) >= 2:
                    break
    assert len(comments) == 2 and all(c.startswith(":") for c in comments)
    # 0.3 s interval: two comments arrive well before the 15 s default would allow.
    assert time.monotonic() - started < 5


# --- GET -----------------------------------------------------------------------------------------


def test_get_opens_sse_stream_and_requires_sse_accept(server: Proc, sid: str) -> None:
    assert_error_body(
        httpx.get(server.url, headers={"Accept": "application/json", "Mcp-Session-Id": sid}, timeout=10), 406
    )
    with httpx.stream("GET", server.url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid},
                      timeout=10) as get:
        assert get.status_code == 200
        first = next(sse_events(get, stop_at_response=False))
        assert isinstance(first, SseEvent) and first.id and first.data == ""


# --- protocol version ----------------------------------------------------------------------------


def test_protocol_version_header(server: Proc, sid: str) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert_error_body(httpx.post(server.url, json=ping, headers=hdrs(sid, "1999-01-01"), timeout=10), 400)
    assert_error_body(httpx.post(server.url, json=init_body(), headers=hdrs(**{"MCP-Protocol-Version": "x"}),
                                 timeout=10), 400)
    for version in (None, "2025-11-25", "2025-06-18", "2025-03-26"):
        resp = httpx.post(server.url, json=ping, headers=hdrs(sid, version), timeout=10)
        assert resp.status_code == 200, (version, resp.text)


@pytest.mark.parametrize("version", ["2025-11-25", "2025-06-18", "2025-03-26"])
def test_negotiation_and_old_clients(server: Proc, version: str) -> None:
    sid, result = open_session(server.url, version)
    assert result["protocolVersion"] == version
    caps = result["capabilities"]
    assert {"tools", "resources", "prompts", "logging", "completions"} <= set(caps)
    tools = json_message(
        httpx.post(server.url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=hdrs(sid, version),
                   timeout=10),
        "tools/list",
    )["result"]["tools"]
    assert tools
    if version == LATEST:
        assert "tasks" in caps and caps["tasks"]["requests"] == {"tools": {"call": {}}}
        assert all("execution" in t for t in tools)
    else:
        assert "tasks" not in caps
        assert all("execution" not in t for t in tools)
    # Plain calls work for every revision.
    with httpx.stream("POST", server.url, headers=hdrs(sid, version), timeout=20,
                      json={"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                            "params": {"name": "test_simple_text", "arguments": {}}}) as resp:
        final = [e for e in sse_events(resp, "tools/call") if isinstance(e, SseEvent)][-1].message
    assert final is not None and final["result"]["content"][0]["type"] == "text"


def test_unknown_requested_version_gets_latest(server: Proc) -> None:
    _, result = open_session(server.url, "2024-01-01")
    assert result["protocolVersion"] == LATEST


# --- Origin / Host / limits / methods -------------------------------------------------------------


def test_origin_not_allowed_is_403(server: Proc) -> None:
    resp = httpx.post(server.url, json=init_body(), headers=hdrs(Origin="http://evil.example.com"), timeout=10)
    msg = assert_error_body(resp, 403)
    assert "id" not in msg
    assert "mcp-session-id" not in resp.headers


def test_origin_same_origin_is_allowed(server: Proc) -> None:
    origin = server.base  # http://127.0.0.1:PORT
    resp = httpx.post(server.url, json=init_body(), headers=hdrs(Origin=origin), timeout=10)
    assert resp.status_code == 200 and json_message(resp, "initialize")
    assert resp.headers["access-control-allow-origin"] == origin


def test_origin_listed_in_settings_is_allowed(tuned: Proc) -> None:
    resp = httpx.post(tuned.url, json=init_body(), headers=hdrs(Origin="https://app.example.com"), timeout=10)
    assert resp.status_code == 200 and json_message(resp, "initialize")
    assert resp.headers["access-control-allow-origin"] == "https://app.example.com"
    other = httpx.post(tuned.url, json=init_body(), headers=hdrs(Origin="https://other.example.com"), timeout=10)
    assert_error_body(other, 403)


@pytest.mark.parametrize("host", ["evil.example.com", "evil.example.com:80", "127.0.0.1.evil.example.com"])
def test_host_not_allowed_is_4xx(server: Proc, host: str) -> None:
    resp = httpx.post(server.url, json=init_body(), headers=hdrs(Host=host, Origin=f"http://{host}"), timeout=10)
    assert 400 <= resp.status_code < 500
    assert_error_body(resp, resp.status_code)
    assert "mcp-session-id" not in resp.headers


def test_body_over_limit_is_413(tuned: Proc) -> None:
    sid, _ = open_session(tuned.url)
    big = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"_meta": {"pad": "x" * 4000}}}
    assert_error_body(httpx.post(tuned.url, json=big, headers=hdrs(sid), timeout=10), 413)
    small = {"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {"_meta": {"pad": "x" * 1000}}}
    assert httpx.post(tuned.url, json=small, headers=hdrs(sid), timeout=10).status_code == 200


def test_unsupported_http_method_is_405_with_allow(server: Proc, sid: str) -> None:
    for method in ("PUT", "PATCH"):
        resp = httpx.request(method, server.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                             headers=hdrs(sid), timeout=10)
        assert_error_body(resp, 405)
        allow = {m.strip() for m in resp.headers["allow"].split(",")}
        assert {"GET", "POST", "DELETE"} <= allow


# --- JSON-RPC errors ------------------------------------------------------------------------------


def test_invalid_json_is_parse_error(server: Proc, sid: str) -> None:
    for raw in (b"{not json", b"", b"\xff\xfe"):
        resp = httpx.post(server.url, content=raw, headers=hdrs(sid), timeout=10)
        msg = assert_error_body(resp, 400, -32700)
        assert "id" not in msg


@pytest.mark.parametrize(
    ("body", "echo_id"),
    [
        ([{"jsonrpc": "2.0", "id": 1, "method": "ping"}], False),
        ([], False),
        ({"jsonrpc": "1.0", "id": 4, "method": "ping"}, True),
        ({"id": 4, "method": "ping"}, True),
        ({"jsonrpc": "2.0", "id": None, "method": "ping"}, False),
        ({"jsonrpc": "2.0", "id": 4, "method": 12}, True),
        ({"jsonrpc": "2.0", "id": 4}, True),
        ("just a string", False),
    ],
)
def test_invalid_request(server: Proc, sid: str, body: Any, echo_id: bool) -> None:
    resp = httpx.post(server.url, content=json.dumps(body).encode(), headers=hdrs(sid), timeout=10)
    msg = assert_error_body(resp, 400, -32600)
    if echo_id:
        assert msg["id"] == 4
    else:
        assert "id" not in msg


def test_unknown_method_and_bad_params(server: Proc, sid: str) -> None:
    resp = httpx.post(server.url, json={"jsonrpc": "2.0", "id": 1, "method": "no/such"}, headers=hdrs(sid),
                      timeout=10)
    assert resp.status_code == 200
    msg = json_message(resp)
    assert msg["id"] == 1 and msg["error"]["code"] == -32601
    resp = httpx.post(server.url, json={"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": 5}},
                      headers=hdrs(sid), timeout=10)
    msg = json_message(resp)
    assert msg["id"] == 2 and msg["error"]["code"] == -32602
    assert msg["error"]["data"][0]["loc"] == ["uri"]


def test_crash_in_handler_is_internal_error_without_traceback(server: Proc, sid: str) -> None:
    resp = httpx.post(server.url, json={"jsonrpc": "2.0", "id": 3, "method": "resources/read",
                                        "params": {"uri": "test://crash"}}, headers=hdrs(sid), timeout=10)
    assert resp.status_code == 200
    msg = json_message(resp)
    assert msg["id"] == 3 and msg["error"]["code"] == -32603
    for marker in TRACEBACK_MARKERS:
        assert marker not in resp.text
    deadline = time.monotonic() + 5
    while "secret-crash-detail" not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = server.log_text()
    assert "Traceback" in log and "secret-crash-detail" in log


# --- resumption ------------------------------------------------------------------------------------


def test_closed_stream_is_resumed_with_last_event_id(server: Proc) -> None:
    sid, _ = open_session(server.url)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "test_reconnection",
                                                                         "arguments": {}}}
    with httpx.stream("POST", server.url, json=body, headers=hdrs(sid, "2025-03-26"), timeout=20) as post:
        events = [e for e in sse_events(post, "tools/call", stop_at_response=False) if isinstance(e, SseEvent)]
    # The server closed the POST stream after the priming event, without the response.
    assert len(events) == 1 and events[0].data == "" and events[0].id and events[0].retry is not None
    last_id = events[0].id
    # Another session cannot resume that stream.
    other, _ = open_session(server.url)
    resp = httpx.get(server.url, timeout=10, headers={"Accept": "text/event-stream", "Mcp-Session-Id": other,
                                                      "Last-Event-ID": last_id})
    assert_error_body(resp, 404)
    malformed = httpx.get(server.url, timeout=10, headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid,
                                                           "Last-Event-ID": "garbage"})
    assert 400 <= malformed.status_code < 500
    # The owner resumes (even while its standalone GET stream is open) and gets the result.
    with httpx.Client(timeout=20) as http:
        with http.stream("GET", server.url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid}) as get:
            assert get.status_code == 200
            with http.stream("GET", server.url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid,
                                                         "MCP-Protocol-Version": "2025-03-26",
                                                         "Last-Event-ID": last_id}) as resumed:
                got = [e for e in sse_events(resumed, "tools/call") if isinstance(e, SseEvent) and e.message]
    final = got[-1].message
    assert final is not None and final["id"] == 1 and "isError" not in final["result"]
    assert final["result"]["content"][0]["text"].startswith("Reconnection test completed successfully.")
    assert got[-1].id and got[-1].id != last_id


def test_mcp_client_and_raw_agree(server: Proc) -> None:
    """Sanity: the McpClient used elsewhere sees the same session rules."""
    with McpClient(server.url) as c:
        c.initialize()
        assert c.request("ping").result == {}
