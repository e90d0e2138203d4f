"""The server features clients expect, end to end against a real daphne process."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.client import McpClient, SseEvent
from tests.support.servers import Proc, Stack


def task_row(stack: Stack, session_id: str, request_id: Any) -> dict[str, Any]:
    """The kind=request row of a plain tools/call, read through manage.py (any backend)."""
    code = (
        "import json; from mcptasks.models import Task; "
        f"t = Task.objects.filter(session_id={session_id!r}, request_id={request_id!r}).order_by('-seq').first(); "
        "print(json.dumps(None if t is None else {'kind': t.kind, 'status': t.status, "
        "'status_message': t.status_message, 'cancel_requested': t.cancel_requested}))"
    )
    out = stack.manage("shell", "-c", code).stdout.strip().splitlines()[-1]
    return json.loads(out)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def paged(stack: Stack) -> Iterator[Proc]:
    """A daphne listing three tools per page."""
    proc = stack.daphne(embedded_worker=False, extra_env={"MCPTASKS_TOOLS_PAGE_SIZE": "3"})
    yield proc
    proc.terminate(timeout=10)


# --- lifecycle -----------------------------------------------------------------------------------


def test_initialize_declares_capabilities_server_info_and_instructions(server: Proc) -> None:
    with McpClient(server.url) as c:
        result = c.initialize().result
    assert result["protocolVersion"] == "2025-11-25"
    assert result["serverInfo"]["name"] == "mcptasks" and result["serverInfo"]["version"]
    assert isinstance(result["instructions"], str) and "tasks/get" in result["instructions"]
    caps = result["capabilities"]
    assert caps["tools"] == {"listChanged": False}
    assert caps["resources"] == {"subscribe": True, "listChanged": False}
    assert caps["prompts"] == {"listChanged": False}
    assert caps["logging"] == {} and caps["completions"] == {}
    # Anonymous callers get no tasks/list (it would expose every anonymous task).
    assert caps["tasks"] == {"cancel": {}, "requests": {"tools": {"call": {}}}}


def test_ping(client: McpClient) -> None:
    assert client.request("ping").result == {}
    assert client.request("ping", {}).result == {}


# --- tools ---------------------------------------------------------------------------------------


def test_tools_list_is_deterministic_and_sorted(client: McpClient) -> None:
    first = client.request("tools/list").result
    second = client.request("tools/list", {}).result
    assert first == second
    names = [t["name"] for t in first["tools"]]
    assert names == sorted(names) and len(names) == len(set(names))
    # A full first page of the default size (50): the e2e stack (demo, testing and both eras'
    # conformance fixtures) has more tools than that; the walk is tested below.
    assert len(names) == 50 and "nextCursor" in first
    demo = {t["name"]: t for t in first["tools"]}["demo_sleep"]
    assert demo["execution"] == {"taskSupport": "optional"}
    assert demo["inputSchema"]["type"] == "object"


def test_tools_list_pagination_walks_every_page(server: Proc, paged: Proc) -> None:
    with McpClient(server.url) as full_client:
        full_client.initialize()
        # Every tool, in pages of the default size (the stack has more than one page of them).
        everything, next_cursor = [], None
        while True:
            page = full_client.request("tools/list", {"cursor": next_cursor} if next_cursor else {}).result
            everything.extend(t["name"] for t in page["tools"])
            next_cursor = page.get("nextCursor")
            if next_cursor is None:
                break
    with McpClient(paged.url) as c:
        c.initialize()
        walked: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            params = {"cursor": cursor} if cursor else {}
            result = c.request("tools/list", params).result
            pages += 1
            assert 1 <= len(result["tools"]) <= 3
            walked.extend(t["name"] for t in result["tools"])
            cursor = result.get("nextCursor")
            if cursor is None:
                break
            assert isinstance(cursor, str) and cursor
            assert pages < 100
        assert walked == everything
        assert pages == -(-len(everything) // 3)
        # A cursor is opaque and signed: tampering with it is -32602.
        first = c.request("tools/list").result["nextCursor"]
        tampered = first[:-2] + ("AA" if not first.endswith("AA") else "BB")
        for bad in (tampered, "not-a-cursor", ""):
            err = c.request("tools/list", {"cursor": bad}).error
            assert err["code"] == -32602, (bad, err)


# --- resources -----------------------------------------------------------------------------------


def test_resources(client: McpClient) -> None:
    listed = client.request("resources/list").result["resources"]
    uris = [r["uri"] for r in listed]
    assert uris == sorted(uris) and "test://static-text" in uris
    templates = client.request("resources/templates/list").result["resourceTemplates"]
    assert any(t["uriTemplate"] == "test://template/{id}/data" for t in templates)
    read = client.request("resources/read", {"uri": "test://template/abc/data"}).result
    assert json.loads(read["contents"][0]["text"])["id"] == "abc"
    err = client.request("resources/read", {"uri": "test://nope"}).error
    assert err["code"] == -32002 and err["data"] == {"uri": "test://nope"}
    assert client.request("resources/subscribe", {"uri": "test://watched-resource"}).result == {}
    assert client.request("resources/unsubscribe", {"uri": "test://watched-resource"}).result == {}
    assert client.request("resources/subscribe", {}).error["code"] == -32602


# --- prompts and completion ----------------------------------------------------------------------


def test_prompts_and_their_errors(client: McpClient) -> None:
    names = [p["name"] for p in client.request("prompts/list").result["prompts"]]
    assert names == sorted(names)
    err = client.request("prompts/get", {"name": "test_prompt_with_arguments"}).error
    assert err["code"] == -32602 and "arg1" in err["message"] and "arg2" in err["message"]
    err = client.request("prompts/get", {"name": "test_prompt_with_arguments", "arguments": {"arg1": "x"}}).error
    assert err["code"] == -32602 and "arg2" in err["message"] and "arg1" not in err["message"]
    err = client.request("prompts/get", {"name": "test_simple_prompt", "arguments": {"zzz": "1"}}).error
    assert err["code"] == -32602 and "zzz" in err["message"]
    err = client.request("prompts/get", {"name": "no_such_prompt"}).error
    assert err["code"] == -32602 and "no_such_prompt" in err["message"]
    err = client.request("prompts/get", {"name": "test_prompt_with_arguments",
                                         "arguments": {"arg1": 1, "arg2": "x"}}).error
    assert err["code"] == -32602


def test_completion(client: McpClient) -> None:
    ref = {"type": "ref/prompt", "name": "test_prompt_with_arguments"}
    got = client.request("completion/complete", {"ref": ref, "argument": {"name": "arg1", "value": "teste"}}).result
    assert got["completion"] == {"values": ["tested"], "total": 1, "hasMore": False}
    got = client.request("completion/complete", {"ref": ref, "argument": {"name": "arg2", "value": "x"}}).result
    assert got["completion"]["values"] == []
    tmpl = {"type": "ref/resource", "uri": "test://template/{id}/data"}
    got = client.request("completion/complete", {"ref": tmpl, "argument": {"name": "id", "value": "1"}}).result
    assert got["completion"]["values"] == []
    err = client.request("completion/complete", {"ref": {"type": "ref/prompt", "name": "nope"},
                                                 "argument": {"name": "a", "value": ""}}).error
    assert err["code"] == -32602


# --- logging -------------------------------------------------------------------------------------


def _log_levels(reply: Any) -> list[str]:
    return [n["params"]["level"] for n in reply.notifications if n["method"] == "notifications/message"]


def test_logging_set_level_filters_notifications(client: McpClient) -> None:
    assert client.request("logging/setLevel", {"level": "error"}).result == {}
    quiet = client.call("test_tool_with_logging", {})
    assert quiet.result["content"][0]["text"] == "Tool with logging executed successfully"
    assert _log_levels(quiet) == []
    assert client.request("logging/setLevel", {"level": "warning"}).result == {}
    assert _log_levels(client.call("test_tool_with_logging", {})) == []
    assert client.request("logging/setLevel", {"level": "debug"}).result == {}
    assert _log_levels(client.call("test_tool_with_logging", {})) == ["info", "info", "info"]
    assert client.request("logging/setLevel", {"level": "loud"}).error["code"] == -32602


# --- progress ------------------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["tok-a", 42, "7"])
def test_progress_uses_the_request_token_with_its_json_type(client: McpClient, token: str | int) -> None:
    reply = client.call("demo_progress", {"steps": 3, "interval_ms": 10}, meta={"progressToken": token})
    progress = [n["params"] for n in reply.notifications if n["method"] == "notifications/progress"]
    assert len(progress) == 3
    assert all(p["progressToken"] == token and type(p["progressToken"]) is type(token) for p in progress)
    values = [p["progress"] for p in progress]
    assert values == sorted(values) and len(set(values)) == 3
    assert "isError" not in reply.result


def test_no_progress_without_a_token(client: McpClient) -> None:
    reply = client.call("demo_progress", {"steps": 2, "interval_ms": 10})
    assert not [n for n in reply.notifications if n["method"] == "notifications/progress"]


# --- cancellation --------------------------------------------------------------------------------


def test_notifications_cancelled_stops_an_inflight_plain_call(client: McpClient, stack: Stack) -> None:
    rid = 4242
    sent: list[float] = []

    def cancel_after_priming(ev: SseEvent) -> bool:
        if not sent:
            # The stream is open, so the request row exists: cancel it.
            resp = client.notify("notifications/cancelled", {"requestId": rid, "reason": "changed my mind"})
            assert resp.status_code == 202 and resp.content == b""
            sent.append(time.monotonic())
        return False

    started = time.monotonic()
    reply = client.call("demo_sleep", {"ms": 20000}, rid=rid, on_event=cancel_after_priming)
    assert sent, "the priming event arrived"
    # The stream ended without a response (the spec: no response to a cancelled request).
    assert reply.message is None
    assert all(e.message is None or "method" in e.message for e in reply.events)
    assert time.monotonic() - started < 10
    row = task_row(stack, client.session_id or "", rid)
    assert row["kind"] == "request" and row["status"] == "cancelled", row


# --- elicitation / sampling during a plain call ---------------------------------------------------


def test_elicitation_and_sampling_on_the_post_stream(client: McpClient) -> None:
    asked: list[str] = []

    def answer(req: dict[str, Any]) -> dict[str, Any]:
        asked.append(req["method"])
        if req["method"] == "elicitation/create":
            return {"action": "decline"}
        return {"model": "m", "role": "assistant", "content": {"type": "text", "text": "sampled!"}}

    declined = client.call("test_elicitation", {"message": "Name?"}, on_request=answer)
    assert declined.content_type.startswith("text/event-stream")
    assert declined.result["content"][0]["text"].startswith("User response: action=decline")
    sampled = client.call("test_sampling", {"prompt": "hi"}, on_request=answer)
    assert sampled.result["content"][0]["text"] == "LLM response: sampled!"
    assert asked == ["elicitation/create", "sampling/createMessage"]
    # The server's request precedes the response on the same stream.
    kinds = ["request" if e.message and "id" in e.message and "method" in e.message else
             "response" if e.message and "method" not in e.message else "other" for e in sampled.events]
    assert kinds.index("request") < kinds.index("response")


def test_old_client_calls_a_task_required_tool_plainly(server: Proc) -> None:
    with McpClient(server.url, protocol_version="2025-06-18") as c:
        c.initialize()
        assert c.protocol_version == "2025-06-18"
        reply = c.call("demo_ask", {"question": "Colour?"},
                       on_request=lambda r: {"action": "accept", "content": {"answer": "blue"}})
        assert "blue" in reply.result["content"][0]["text"]


def test_client_without_elicitation_gets_a_clear_error(server: Proc) -> None:
    with McpClient(server.url, capabilities={}) as c:
        c.initialize()
        reply = c.call("test_elicitation", {"message": "Name?"},
                       on_request=lambda r: pytest.fail(f"server asked anyway: {r}"))
        assert not reply.requests
        msg = reply.message
        assert msg is not None
        if "error" in msg:
            text = msg["error"]["message"]
        else:
            assert msg["result"].get("isError") is True
            text = msg["result"]["content"][0]["text"]
        assert "elicitation" in text and "capability" in text
