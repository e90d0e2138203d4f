"""MCP 2026-07-28 against a real daphne (and a separate worker with PostgreSQL + Redis).

The stateless era and the session era on one endpoint and one store: a task with
elicitation driven through ``tasks/get``/``tasks/update``, input rounds of plain calls with
signed ``requestState``, tasks crossing eras, and refusals that must not leak.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.live_support import wait_status
from tests.support.client import McpClient
from tests.support.client2026 import TASKS_EXTENSION, Client2026
from tests.support.schema2026 import validate_2026
from tests.support.servers import Proc, Stack

TASKS = {"elicitation": {}, "sampling": {}, "roots": {}, "extensions": {TASKS_EXTENSION: {}}}


@pytest.fixture
def c26(server: Proc) -> Iterator[Client2026]:
    with Client2026(server.url, capabilities=TASKS) as c:
        yield c


def test_task_with_elicitation_end_to_end(c26: Client2026) -> None:
    created = c26.result("tools/call", {"name": "confirm_delete", "arguments": {"filename": "a.txt"}})
    validate_2026("Result", created)
    assert created["resultType"] == "task" and "task" not in created and "requestState" not in created
    assert set(created) >= {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs"}
    assert "ttl" not in created and "pollInterval" not in created
    task_id = created["taskId"]
    waiting = c26.wait_status(task_id, {"input_required"})
    assert waiting["status"] == "input_required" and waiting["resultType"] == "complete"
    (key, request), = waiting["inputRequests"].items()
    assert request["method"] == "elicitation/create" and "a.txt" in request["params"]["message"]
    validate_2026("ElicitRequestFormParams", request["params"])
    ack = c26.result("tasks/update", {"taskId": task_id, "inputResponses": {
        key: {"action": "accept", "content": {"confirm": True}}}})
    assert ack == {"resultType": "complete"}
    done = c26.wait_status(task_id, {"completed", "failed", "cancelled"})
    assert done["status"] == "completed" and "inputRequests" not in done
    assert done["result"]["content"][0]["text"] == "Deleted a.txt"
    # The key is spent: answering it again changes nothing and is still acknowledged.
    assert c26.result("tasks/update", {"taskId": task_id, "inputResponses": {
        key: {"action": "accept", "content": {"confirm": False}}}}) == {"resultType": "complete"}
    assert c26.result("tasks/get", {"taskId": task_id})["result"]["content"][0]["text"] == "Deleted a.txt"


def test_partial_answers_keep_the_task_waiting_for_the_rest(c26: Client2026) -> None:
    task_id = c26.result("tools/call", {"name": "multi_input", "arguments": {}})["taskId"]
    deadline = time.monotonic() + 20
    while True:
        task = c26.result("tasks/get", {"taskId": task_id})
        if len(task.get("inputRequests", {})) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    first, second = list(task["inputRequests"])
    c26.result("tasks/update", {"taskId": task_id, "inputResponses": {
        first: {"action": "accept", "content": {"name": "one"}}}})
    after = c26.result("tasks/get", {"taskId": task_id})
    assert after["status"] == "input_required" and list(after["inputRequests"]) == [second]
    c26.result("tasks/update", {"taskId": task_id, "inputResponses": {
        second: {"action": "accept", "content": {"name": "two"}}}})
    done = c26.wait_status(task_id, {"completed", "failed", "cancelled"})
    assert done["result"]["content"][0]["text"] == "Answers: one, two"


def test_tool_errors_complete_and_protocol_errors_fail(c26: Client2026) -> None:
    failing = c26.result("tools/call", {"name": "failing_job", "arguments": {}})["taskId"]
    crashing = c26.result("tools/call", {"name": "protocol_error_job", "arguments": {}})["taskId"]
    tool_error = c26.wait_status(failing, {"completed", "failed", "cancelled"})
    assert tool_error["status"] == "completed" and tool_error["result"]["isError"] is True
    protocol_error = c26.wait_status(crashing, {"completed", "failed", "cancelled"})
    assert protocol_error["status"] == "failed" and "result" not in protocol_error
    assert isinstance(protocol_error["error"]["code"], int) and protocol_error["error"]["message"]


def test_cancel_is_acknowledged_and_idempotent(c26: Client2026) -> None:
    task_id = c26.result("tools/call", {"name": "slow_compute", "arguments": {"seconds": 30}})["taskId"]
    assert c26.result("tasks/cancel", {"taskId": task_id}) == {"resultType": "complete"}
    assert c26.result("tasks/get", {"taskId": task_id})["status"] == "cancelled"
    assert c26.result("tasks/cancel", {"taskId": task_id}) == {"resultType": "complete"}


def test_without_the_extension_a_task_capable_tool_runs_plainly(server: Proc) -> None:
    with Client2026(server.url, capabilities={}) as plain:
        result = plain.result("tools/call", {"name": "slow_compute", "arguments": {"seconds": 0}})
        assert result["resultType"] == "complete" and "taskId" not in result
        status, refused = plain.send("tools/call", {"name": "failing_job", "arguments": {}})
        assert status == 400 and refused["error"]["code"] == -32021


def test_plain_call_input_rounds_with_signed_state(server: Proc) -> None:
    with Client2026(server.url, capabilities={"elicitation": {}}) as c:
        params: dict[str, Any] = {"name": "test_input_required_result_multi_round", "arguments": {}}
        r1 = c.result("tools/call", params)
        validate_2026("InputRequiredResult", r1)
        assert list(r1["inputRequests"]) == ["step1"] and isinstance(r1["requestState"], str)
        state = r1["requestState"]
        forged = state[:-2] + ("A" if state[-2] != "A" else "B") + state[-1]
        _, bad = c.send("tools/call", {**params, "requestState": forged, "inputResponses": {}})
        assert bad["error"]["code"] == -32602
        again = c.result("tools/call", {**params, "requestState": state, "inputResponses": {"other": {}}})
        assert list(again["inputRequests"]) == ["step1"]
        r2 = c.result("tools/call", {**params, "requestState": state, "inputResponses": {
            "step1": {"action": "accept", "content": {"name": "Ada"}}}})
        assert list(r2["inputRequests"]) == ["step2"] and r2["requestState"] != state
        r3 = c.result("tools/call", {**params, "requestState": r2["requestState"], "inputResponses": {
            "step2": {"action": "accept", "content": {"color": "red"}}}})
        assert r3 == {"resultType": "complete", "content": [{"type": "text", "text": "Ada likes red"}]}


def test_request_state_and_tasks_are_bound_to_the_caller(server: Proc, stack: Stack) -> None:
    alice = Client2026(server.url, capabilities=TASKS, token=stack.token("era", "alice"))
    mallory = Client2026(server.url, capabilities=TASKS, token=stack.token("era", "mallory"))
    outsider = Client2026(server.url, capabilities=TASKS, token=stack.token("other-era", "alice"))
    with alice, mallory, outsider:
        r1 = alice.result("tools/call", {"name": "test_input_required_result_elicitation", "arguments": {}})
        steal = {"name": "test_input_required_result_elicitation", "arguments": {},
                 "requestState": r1["requestState"],
                 "inputResponses": {"user_name": {"action": "accept", "content": {"name": "m"}}}}
        for other in (mallory, outsider):
            _, refused = other.send("tools/call", steal)
            assert refused["error"]["code"] == -32602
        task_id = alice.result("tools/call", {"name": "confirm_delete", "arguments": {"filename": "x"}})["taskId"]
        _, missing = outsider.send("tasks/get", {"taskId": "no-such-task"})
        for other in (mallory, outsider):
            for method, params in (("tasks/get", {"taskId": task_id}),
                                   ("tasks/update", {"taskId": task_id, "inputResponses": {}}),
                                   ("tasks/cancel", {"taskId": task_id})):
                _, refused = other.send(method, params)
                assert refused["error"] == missing["error"], (method, refused)
        assert alice.wait_status(task_id, {"input_required"})["status"] == "input_required"
        alice.result("tasks/cancel", {"taskId": task_id})


def test_tasks_cross_eras_both_ways(server: Proc, c26: Client2026) -> None:
    with McpClient(server.url) as legacy:
        legacy.initialize()
        made_2025 = legacy.request("tools/call", {"name": "slow_compute", "arguments": {"seconds": 0},
                                                  "task": {"ttl": 60000}}).result["task"]["taskId"]
        done = c26.wait_status(made_2025, {"completed", "failed", "cancelled"})
        assert done["status"] == "completed" and done["result"]["content"][0]["text"].startswith("Computed")
        made_2026 = c26.result("tools/call", {"name": "slow_compute", "arguments": {"seconds": 30}})["taskId"]
        assert legacy.request("tasks/get", {"taskId": made_2026}).result["status"] == "working"
        cancelled = legacy.request("tasks/cancel", {"taskId": made_2026}).result
        assert cancelled["status"] == "cancelled"
        assert c26.result("tasks/get", {"taskId": made_2026})["status"] == "cancelled"
        # And the 2025 client still reads its own task with the 2025 methods.
        assert wait_status(legacy, made_2025, {"completed"})["status"] == "completed"


def test_plain_call_with_a_progress_token_streams_progress_then_the_result(server: Proc) -> None:
    import httpx

    from tests.support.client import iter_sse

    body = {"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {
        "name": "demo_progress", "arguments": {"steps": 3, "interval_ms": 50},
        "_meta": {"progressToken": "tok", "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}}
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "demo_progress"}
    with httpx.stream("POST", server.url, json=body, headers=headers, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        messages = [e.message for e in iter_sse(response.iter_lines()) if not isinstance(e, str) and e.message]
    progress = [m["params"]["progress"] for m in messages if m.get("method") == "notifications/progress"]
    assert progress == [1, 2, 3] and all(m["params"]["progressToken"] == "tok" for m in messages[:-1])
    assert not any("id" in m and "method" in m for m in messages)  # no server requests on the stream
    final = messages[-1]
    assert final["id"] == 77 and final["result"]["resultType"] == "complete"
    assert final["result"]["content"][0]["text"] == "Completed 3 steps"


def test_input_gathered_in_rounds_then_handed_over_as_a_task(c26: Client2026) -> None:
    r1 = c26.result("tools/call", {"name": "test_tool_with_task", "arguments": {}})
    assert r1["resultType"] == "input_required" and "taskId" not in r1 and list(r1["inputRequests"]) == ["user_name"]
    r2 = c26.result("tools/call", {"name": "test_tool_with_task", "arguments": {}, "requestState": r1["requestState"],
                                   "inputResponses": {"user_name": {"action": "accept", "content": {"name": "Alice"}}}})
    assert r2["resultType"] == "task" and "requestState" not in r2
    done = c26.wait_status(r2["taskId"], {"completed", "failed", "cancelled"})
    assert done["result"]["content"][0]["text"] == "Hello, Alice!"


def test_answers_sent_with_the_first_call_are_used_and_extra_keys_ignored(server: Proc) -> None:
    with Client2026(server.url, capabilities={"elicitation": {}}) as c:
        result = c.result("tools/call", {"name": "test_input_required_result_elicitation", "arguments": {},
                                         "inputResponses": {
                                             "user_name": {"action": "accept", "content": {"name": "Alice"}},
                                             "unknown_extra_key": {"action": "accept", "content": {}}}})
        assert result == {"resultType": "complete", "content": [{"type": "text", "text": "Hello, Alice!"}]}
