"""One test per MUST / SHOULD of the MCP 2025-11-25 tasks specification, through real HTTP.

Every test talks to a real daphne process (plus a worker process on PostgreSQL + Redis, the
embedded worker on SQLite). Each test is named after the rule it proves; the rule is quoted
above it. Everything the server sends is validated against the official JSON schema by the
test client. Section names refer to the 2025-11-25 Tasks specification (basic/utilities/tasks).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import pytest

from mcptasks.protocol.messages import can_transition
from tests.support.client import McpClient, Reply
from tests.support.servers import Proc, Stack

RELATED = "io.modelcontextprotocol/related-task"
IMMEDIATE = "io.modelcontextprotocol/model-immediate-response"
ISO_8601 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
TERMINAL = {"completed", "failed", "cancelled"}
PAGE_SIZE = 3  # tasks/list page size of this module's server, so pagination is cheap to exercise
DEFAULT_TTL_MS = 3_600_000
MAX_TTL_MS = 86_400_000
DEFAULT_POLL_MS = 1000


# --- fixtures and helpers ----------------------------------------------------------------------


#: The periodic re-check of a blocked tasks/result pushed far out, so a waiter that returns in
#: time was woken by the change's signal (a lost signal fails the test instead of being hidden).
NO_BACKSTOP = {"MCPTASKS_TASK_RESULT_RECHECK_S": "60"}


@pytest.fixture(scope="module")
def server(stack: Stack) -> Iterator[Proc]:
    """This module's daphne: a small tasks/list page size (plus a worker process when multi-process)."""
    procs = [stack.daphne(extra_env={"MCPTASKS_TASK_LIST_PAGE_SIZE": str(PAGE_SIZE), **NO_BACKSTOP})]
    if stack.multi_process:
        procs.append(stack.worker(concurrency=8))
    yield procs[0]
    for p in procs:
        p.terminate(timeout=10)


@pytest.fixture(scope="module")
def tokens(stack: Stack) -> dict[str, str]:
    """Bearer tokens of two principals of one tenant and one of another tenant."""
    return {
        "alice": stack.token("acme", "alice"),
        "bob": stack.token("acme", "bob"),
        "eve": stack.token("other", "eve"),
    }


@pytest.fixture
def alice(server: Proc, tokens: dict[str, str]) -> Iterator[McpClient]:
    with McpClient(server.url, token=tokens["alice"]) as c:
        c.initialize()
        yield c


@pytest.fixture
def bob(server: Proc, tokens: dict[str, str]) -> Iterator[McpClient]:
    with McpClient(server.url, token=tokens["bob"]) as c:
        c.initialize()
        yield c


def db_json(stack: Stack, expr: str, imports: str = "") -> Any:
    """Evaluate ``expr`` inside the stack's database (manage.py shell) and return it as JSON."""
    code = f"import json\n{imports}\nprint('@@' + json.dumps({expr}, default=str))"
    out = stack.manage("shell", "-c", code).stdout
    line = next(ln for ln in reversed(out.splitlines()) if ln.startswith("@@"))
    return json.loads(line[2:])


def run_events(stack: Stack, key: str) -> list[str]:
    """Events ("start"/"end") the test tools recorded for ``key``, read straight from the stack's database."""
    url = stack.env["DATABASE_URL"]
    sql = "SELECT event FROM mcptasks_testing_runrecord WHERE task_key = {} ORDER BY id"
    if url.startswith("sqlite:"):
        import sqlite3

        with closing(sqlite3.connect(url.removeprefix("sqlite:///"), timeout=10)) as conn:
            return [r[0] for r in conn.execute(sql.format("?"), (key,))]
    import psycopg

    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(sql.format("%s"), (key,))]


def wait_until(pred: Callable[[], Any], timeout: float = 20.0, interval: float = 0.1) -> Any:
    """Poll ``pred`` until it returns something truthy (or fail at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        time.sleep(interval)


def get(client: McpClient, task_id: str) -> dict[str, Any]:
    return client.request("tasks/get", {"taskId": task_id}).result


def wait_status(client: McpClient, task_id: str, *statuses: str, timeout: float = 20.0) -> dict[str, Any]:
    """Poll tasks/get until the task is in one of ``statuses``."""

    def check() -> dict[str, Any] | None:
        task = get(client, task_id)
        return task if task["status"] in statuses else None

    return wait_until(check, timeout=timeout)  # type: ignore[no-any-return]


def twin(client: McpClient) -> McpClient:
    """A second connection in the same session (for a request running while we do others)."""
    other = McpClient(client.url, token=client.token, protocol_version=client.protocol_version)
    other.session_id = client.session_id
    return other


def in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - surfaced by the test
            box["error"] = exc
        box["at"] = time.monotonic()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, box


def assert_task_object(task: dict[str, Any]) -> None:
    """The Task data type: ISO 8601 createdAt/lastUpdatedAt, ttl present (null = unlimited)."""
    assert isinstance(task["taskId"], str) and task["taskId"]
    assert ISO_8601.match(task["createdAt"]), task
    assert ISO_8601.match(task["lastUpdatedAt"]), task
    assert "ttl" in task
    assert task["lastUpdatedAt"] >= task["createdAt"]


# === Capabilities ==============================================================================

# "Servers and clients that support task-augmented requests MUST declare a `tasks` capability
# during initialization." (tasks.list / tasks.cancel / tasks.requests.tools.call)
def test_server_must_declare_tasks_capability_during_initialization(server: Proc, tokens: dict[str, str]) -> None:
    with McpClient(server.url, token=tokens["alice"]) as c:
        caps = c.initialize().result["capabilities"]
    assert caps["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}


# "Receivers that cannot identify requestors SHOULD NOT declare the tasks.list capability, as
# listing tasks would expose task metadata to any requestor regardless of task ID entropy."
def test_receiver_that_cannot_identify_requestor_should_not_declare_tasks_list(client: McpClient) -> None:
    reply = McpClient(client.url)
    with reply as anon:
        caps = anon.initialize().result["capabilities"]
        assert caps["tasks"] == {"cancel": {}, "requests": {"tools": {"call": {}}}}
        err = anon.request("tasks/list", {}).error
    assert err["code"] == -32601


# Tasks exist from protocol revision 2025-11-25 on: older clients are not offered them.
def test_tasks_capability_is_only_declared_to_2025_11_25_clients(server: Proc) -> None:
    with McpClient(server.url, protocol_version="2025-06-18") as old:
        result = old.initialize().result
        assert result["protocolVersion"] == "2025-06-18"
        assert "tasks" not in result["capabilities"]
        tools = old.request("tools/list", {}).result["tools"]
    assert all("execution" not in t for t in tools)


# "Receivers that do not declare the task capability for a request type MUST process requests of
# that type normally, ignoring any task-augmentation metadata if present."
def test_receiver_without_task_capability_must_process_request_normally_ignoring_task(server: Proc) -> None:
    with McpClient(server.url, protocol_version="2025-06-18") as old:
        old.initialize()
        reply = old.call("demo_sleep", {"ms": 10}, task={"ttl": 60000})
    assert reply.result["content"] == [{"type": "text", "text": "Slept for 10 ms"}]
    assert "task" not in reply.result


# "In the result of tools/list, tools declare support for tasks via execution.taskSupport, which
# if present can have a value of "required", "optional", or "forbidden"."
def test_tools_must_declare_task_support_in_tools_list(client: McpClient) -> None:
    tools: dict[str, Any] = {}
    cursor: str | None = None
    while True:
        page = client.request("tools/list", {"cursor": cursor} if cursor else {}).result
        tools.update({t["name"]: t for t in page["tools"]})
        cursor = page.get("nextCursor")
        if not cursor:
            break
    support = {n: tools[n].get("execution", {}).get("taskSupport") for n in (
        "demo_sleep", "demo_fail", "demo_crash", "demo_progress", "demo_ask", "demo_sample", "demo_quick")}
    assert support == {
        "demo_sleep": "optional", "demo_fail": "optional", "demo_crash": "optional", "demo_progress": "optional",
        "demo_ask": "required", "demo_sample": "required", "demo_quick": "forbidden",
    }


# "If execution.taskSupport is not present or "forbidden", clients MUST NOT attempt to invoke the
# tool as a task. Servers SHOULD return a -32601 (Method not found) error if a client attempts to do so."
def test_server_should_return_32601_for_task_augmented_call_of_forbidden_tool(client: McpClient) -> None:
    reply = client.call("demo_quick", {}, task={"ttl": 60000})
    assert reply.status == 200
    assert reply.error["code"] == -32601
    assert "result" not in (reply.message or {})  # a JSON-RPC error, not an isError result


# "If execution.taskSupport is "required", clients MUST invoke the tool as a task. Servers MUST
# return a -32601 (Method not found) error if a client does not attempt to do so."
def test_server_must_return_32601_for_plain_call_of_task_required_tool(client: McpClient) -> None:
    reply = client.call("demo_ask", {"question": "why?"})
    assert reply.error["code"] == -32601


# === Creating tasks ============================================================================

# "Receivers that accept a task-augmented request MUST return a CreateTaskResult as the response."
def test_receiver_must_return_create_task_result_for_task_augmented_request(client: McpClient) -> None:
    reply = client.call("demo_sleep", {"ms": 10}, task={"ttl": 60000})
    result = reply.result
    assert set(result) <= {"task", "_meta"}  # task data only, not the tool's result
    assert_task_object(result["task"])
    assert "content" not in result


# "This result SHOULD be returned as soon as possible after accepting the task."  The task row is
# committed before the reply, so tasks/get succeeds right away (on any process: see the
# cross-process tests).
def test_create_task_result_should_be_returned_as_soon_as_possible(client: McpClient) -> None:
    started = time.monotonic()
    task = client.call_task("demo_sleep", {"ms": 5000})
    assert time.monotonic() - started < 2.5
    assert get(client, task["taskId"])["status"] == "working"
    client.request("tasks/cancel", {"taskId": task["taskId"]})


# "servers can provide an optional io.modelcontextprotocol/model-immediate-response key in the
# _meta field of the CreateTaskResult" (when the tool supplies one).
def test_create_task_result_carries_model_immediate_response_when_tool_supplies_one(client: McpClient) -> None:
    with_text = client.call("demo_sleep", {"ms": 10}, task={}).result
    assert isinstance(with_text["_meta"][IMMEDIATE], str) and with_text["_meta"][IMMEDIATE]
    without = client.call("demo_fail", {}, task={}).result
    assert IMMEDIATE not in (without.get("_meta") or {})


# === Task IDs ==================================================================================

# "Task IDs MUST be a string value." "Task IDs MUST be generated by the receiver when creating a
# task." "Task IDs MUST be unique among all tasks controlled by the receiver."
def test_task_ids_must_be_unique_receiver_generated_strings(client: McpClient) -> None:
    ids = [client.call("demo_sleep", {"ms": 1}, task={"taskId": "mine"}).result["task"]["taskId"] for _ in range(8)]
    assert all(isinstance(i, str) for i in ids)
    assert "mine" not in ids  # a requestor-supplied id is ignored
    assert len(set(ids)) == len(ids)
    # Unguessable: 192 random bits, URL-safe base64 (32 characters).
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{32}", i) for i in ids)


# === Task status lifecycle =====================================================================

# "Tasks MUST begin in the working status when created."
def test_tasks_must_begin_in_working_status(client: McpClient) -> None:
    created = client.call_task("demo_sleep", {"ms": 300})
    assert created["status"] == "working"
    first_get = get(client, created["taskId"])
    assert first_get["status"] in ("working", "completed")
    assert first_get["createdAt"] == created["createdAt"]


# "Receivers MUST only transition tasks through the following valid paths: From working: may move
# to input_required, completed, failed, or cancelled; From input_required: may move to working,
# completed, failed, or cancelled."  Observed through the notifications/tasks/status stream of a
# task that goes working -> input_required -> working -> completed.
def test_receivers_must_only_transition_tasks_through_valid_paths(client: McpClient) -> None:
    task = client.call_task("demo_ask", {"question": "Your name?"})
    reply = client.request(
        "tasks/result", {"taskId": task["taskId"]},
        on_request=lambda req: {"action": "accept", "content": {"answer": "Ada"}},
    )
    assert reply.result["content"][0]["text"] == "Ada"
    seen = ["working"] + [n["params"]["status"] for n in reply.notifications
                          if n["method"] == "notifications/tasks/status"]
    seen = [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]]  # statusMessage-only updates
    assert seen[-1] == "completed"
    for src, dst in zip(seen, seen[1:], strict=False):
        assert can_transition(src, dst), f"illegal transition {src} -> {dst} in {seen}"


# "Tasks with a completed, failed, or cancelled status are in a terminal state and MUST NOT
# transition to any other status."
def test_terminal_tasks_must_not_transition_to_any_other_status(client: McpClient) -> None:
    task = client.call_task("demo_sleep", {"ms": 10})
    done = wait_status(client, task["taskId"], *TERMINAL)
    assert done["status"] == "completed"
    assert client.request("tasks/cancel", {"taskId": task["taskId"]}).error["code"] == -32602
    again = get(client, task["taskId"])
    assert again["status"] == "completed"
    assert again["lastUpdatedAt"] == done["lastUpdatedAt"]


# === Input required ============================================================================

# "When the task receiver has messages for the requestor that are necessary to complete the task,
# the receiver SHOULD move the task to the input_required status."  "The receiver MUST include the
# io.modelcontextprotocol/related-task metadata in the request to associate it with the task."
# "When the receiver receives all required input, the task SHOULD transition out of
# input_required status (typically back to working)."
def test_receiver_should_move_task_to_input_required_and_back_when_input_arrives(client: McpClient) -> None:
    task = client.call_task("demo_ask", {"question": "Colour?"})
    tid = task["taskId"]
    assert wait_status(client, tid, "input_required")["status"] == "input_required"
    elicitations: list[dict[str, Any]] = []
    statuses_after_answer: list[str] = []

    def answer(req: dict[str, Any]) -> dict[str, Any]:
        elicitations.append(req)
        return {"action": "accept", "content": {"answer": "blue"}}

    def on_event(ev: Any) -> None:
        if elicitations and ev.message and ev.message.get("method") == "notifications/tasks/status":
            statuses_after_answer.append(ev.message["params"]["status"])

    reply = client.request("tasks/result", {"taskId": tid}, on_request=answer, on_event=on_event)
    assert reply.result["content"][0]["text"] == "blue"
    assert len(elicitations) == 1
    assert elicitations[0]["method"] == "elicitation/create"
    assert elicitations[0]["params"]["_meta"][RELATED] == {"taskId": tid}
    assert statuses_after_answer and statuses_after_answer[0] in ("working", "completed")
    assert get(client, tid)["status"] == "completed"


# === TTL and resource management ===============================================================

# "Receivers MUST include a createdAt ISO 8601-formatted timestamp in all task responses" and
# "MUST include a lastUpdatedAt ISO 8601-formatted timestamp in all task responses" (creation,
# tasks/get, tasks/list, tasks/cancel and notifications/tasks/status).
def test_receivers_must_include_iso8601_created_at_and_last_updated_at_in_all_task_responses(
    alice: McpClient,
) -> None:
    created = alice.call_task("demo_progress", {"steps": 2, "interval_ms": 50}, meta={"progressToken": "p1"})
    assert_task_object(created)
    assert_task_object(get(alice, created["taskId"]))
    assert all(assert_task_object(t) is None for t in alice.request("tasks/list", {}).result["tasks"])
    reply = alice.request("tasks/result", {"taskId": created["taskId"]})
    statuses = [n["params"] for n in reply.notifications if n["method"] == "notifications/tasks/status"]
    for params in statuses:
        assert_task_object(params)
    doomed = alice.call_task("demo_sleep", {"ms": 5000})
    assert_task_object(alice.request("tasks/cancel", {"taskId": doomed["taskId"]}).result)


# "Receivers MAY override the requested ttl duration." "Receivers MUST include the actual ttl
# duration (or null for unlimited) in tasks/get responses."  "Receivers SHOULD enforce maximum
# ttl durations to prevent indefinite resource retention."  A requested ttl is always clamped to
# the maximum (MCPTASKS_TASK_MAX_TTL_MS, per tenant max_ttl_ms); without one the default applies.
def test_receiver_must_return_actual_ttl_clamped_to_maximum(client: McpClient) -> None:
    huge = client.call_task("demo_sleep", {"ms": 1}, ttl=10**12)
    assert huge["ttl"] == MAX_TTL_MS
    assert get(client, huge["taskId"])["ttl"] == MAX_TTL_MS
    small = client.call_task("demo_sleep", {"ms": 1}, ttl=120_000)
    assert get(client, small["taskId"])["ttl"] == 120_000
    default = client.call_task("demo_sleep", {"ms": 1})
    assert get(client, default["taskId"])["ttl"] == DEFAULT_TTL_MS


# "Receivers MAY include a pollInterval value (in milliseconds) in tasks/get responses to suggest
# polling intervals."
def test_receiver_includes_poll_interval_in_tasks_get(client: McpClient) -> None:
    task = client.call_task("demo_sleep", {"ms": 1})
    assert task["pollInterval"] == DEFAULT_POLL_MS
    assert get(client, task["taskId"])["pollInterval"] == DEFAULT_POLL_MS


# "After a task's ttl lifetime has elapsed, receivers MAY delete the task and its results" and the
# Error Handling example: -32602 "Failed to retrieve task: Task has expired".  Until cleanup deletes
# it, an expired task answers exactly that on tasks/get, tasks/result and tasks/cancel.
def test_expired_task_must_answer_32602_task_has_expired(client: McpClient) -> None:
    task = client.call_task("demo_sleep", {"ms": 5000}, ttl=1)
    assert task["ttl"] == 1
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        err = client.request(method, {"taskId": task["taskId"]}).error
        assert err == {"code": -32602, "message": "Failed to retrieve task: Task has expired"}, method


# === Getting tasks =============================================================================

# "Where possible, servers SHOULD NOT upgrade to an SSE stream in response to a tasks/get request,
# as the client has indicated it wishes to poll for a result."
def test_server_should_not_upgrade_tasks_get_to_sse(client: McpClient) -> None:
    task = client.call_task("demo_sleep", {"ms": 500})
    reply = client.request("tasks/get", {"taskId": task["taskId"]})
    assert reply.content_type.startswith("application/json")
    assert reply.result["taskId"] == task["taskId"]


# "Invalid or nonexistent taskId in tasks/get, tasks/result, or tasks/cancel: -32602 (Invalid
# params)" with the example message "Failed to retrieve task: Task not found".
def test_receiver_must_return_32602_task_not_found_for_unknown_task_id(client: McpClient) -> None:
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        err = client.request(method, {"taskId": "no-such-task"}).error
        assert err == {"code": -32602, "message": "Failed to retrieve task: Task not found"}, method
        assert client.request(method, {"taskId": 42}).error["code"] == -32602  # not even a string


# === Retrieving results ========================================================================

# "When a receiver receives a tasks/result request for a task in any other non-terminal status
# (working or input_required), it MUST block the response until the task reaches a terminal status."
def test_tasks_result_must_block_until_terminal(client: McpClient) -> None:
    task = client.call_task("demo_sleep", {"ms": 1500})
    tid = task["taskId"]
    waiter = twin(client)
    th, box = in_background(lambda: waiter.request("tasks/result", {"taskId": tid}))
    time.sleep(0.5)  # give the blocking request time to (wrongly) return early
    assert th.is_alive(), "tasks/result returned before the task was terminal"
    assert get(client, tid)["status"] == "working"
    th.join(20)
    waiter.close()
    assert "error" not in box, box.get("error")
    assert box["value"].result["content"] == [{"type": "text", "text": "Slept for 1500 ms"}]
    assert get(client, tid)["status"] == "completed"


# "When a receiver receives a tasks/result request for a task in a terminal status ... it MUST return
# the final result of the underlying request" and "The tasks/result operation MUST include this
# metadata [io.modelcontextprotocol/related-task] in its response".
def test_tasks_result_must_return_final_result_with_related_task_meta(client: McpClient) -> None:
    task = client.call_task("demo_sleep", {"ms": 10})
    wait_status(client, task["taskId"], *TERMINAL)
    result = client.request("tasks/result", {"taskId": task["taskId"]}).result
    plain = client.call("demo_sleep", {"ms": 10}).result
    assert result["_meta"][RELATED] == {"taskId": task["taskId"]}
    # Exactly what the underlying tools/call would have returned, plus the related-task _meta.
    assert {k: v for k, v in result.items() if k != "_meta"} == {k: v for k, v in plain.items() if k != "_meta"}


# "If the underlying request resulted in a JSON-RPC error, tasks/result MUST return that same
# JSON-RPC error."  A crashing tool is an internal error (-32603); "The tasks/get response SHOULD
# include a statusMessage field with diagnostic information about the failure."
def test_tasks_result_must_return_json_rpc_error_of_failed_request(client: McpClient) -> None:
    task = client.call_task("demo_crash", {"message": "boom"})
    failed = wait_status(client, task["taskId"], *TERMINAL)
    assert failed["status"] == "failed"
    assert "boom" in failed["statusMessage"]
    err = client.request("tasks/result", {"taskId": task["taskId"]}).error
    assert err["code"] == -32603
    assert "boom" in err["message"]


# "For tool calls specifically, this includes cases where the tool call result has isError set to
# true" -> failed; "If the request completed with a JSON-RPC response, tasks/result MUST return a
# successful JSON-RPC response containing that result."
def test_is_error_tool_result_must_fail_task_and_tasks_result_returns_that_result(client: McpClient) -> None:
    task = client.call_task("demo_fail", {"message": "bad input"})
    failed = wait_status(client, task["taskId"], *TERMINAL)
    assert failed["status"] == "failed"
    assert "bad input" in failed["statusMessage"]
    result = client.request("tasks/result", {"taskId": task["taskId"]}).result
    assert result["isError"] is True
    assert result["content"] == [{"type": "text", "text": "bad input"}]
    assert result["_meta"][RELATED] == {"taskId": task["taskId"]}


# tasks/result of a cancelled task: the request never produced a result, so (documented choice)
# the server answers the JSON-RPC error -32603 "Task was cancelled"; it does not block.
def test_tasks_result_of_cancelled_task_returns_documented_error(client: McpClient) -> None:
    task = client.call_task("demo_sleep", {"ms": 5000})
    client.request("tasks/cancel", {"taskId": task["taskId"]})
    err = client.request("tasks/result", {"taskId": task["taskId"]}).error
    assert err == {"code": -32603, "message": "Task was cancelled"}


# A tasks/result that is blocked when the task gets cancelled returns at once, with that error.
def test_blocked_tasks_result_returns_when_task_is_cancelled(client: McpClient) -> None:
    task = client.call_task("demo_sleep", {"ms": 10_000})
    waiter = twin(client)
    th, box = in_background(lambda: waiter.request("tasks/result", {"taskId": task["taskId"]}))
    time.sleep(0.3)
    assert th.is_alive()
    cancelled_at = time.monotonic()
    client.request("tasks/cancel", {"taskId": task["taskId"]})
    th.join(10)
    waiter.close()
    assert box["value"].error["code"] == -32603
    assert box["at"] - cancelled_at < 3  # woken by the signal, well before the tool would end


# === Associating task-related messages =========================================================

# "All requests, notifications, and responses related to a task MUST include the
# io.modelcontextprotocol/related-task key in their _meta field" and "The progressToken provided in
# the initial request remains valid throughout the task lifetime."
def test_task_progress_notifications_must_include_related_task_meta(client: McpClient) -> None:
    task = client.call_task("demo_progress", {"steps": 3, "interval_ms": 150}, meta={"progressToken": "tok-1"})
    reply = client.request("tasks/result", {"taskId": task["taskId"]})
    assert reply.result["content"][0]["text"] == "Completed 3 steps"
    progress = [n for n in reply.notifications if n["method"] == "notifications/progress"]
    assert progress, "no progress notification reached the tasks/result stream"
    for n in progress:
        assert n["params"]["progressToken"] == "tok-1"
        assert n["params"]["_meta"][RELATED] == {"taskId": task["taskId"]}


# "For the tasks/get, tasks/list, and tasks/cancel operations, receivers SHOULD NOT include
# io.modelcontextprotocol/related-task metadata in the result messages."
def test_tasks_get_list_cancel_results_should_not_include_related_task_meta(alice: McpClient) -> None:
    task = alice.call_task("demo_sleep", {"ms": 5000})
    results = [
        alice.request("tasks/get", {"taskId": task["taskId"]}).result,
        alice.request("tasks/list", {}).result,
        alice.request("tasks/cancel", {"taskId": task["taskId"]}).result,
    ]
    for result in results:
        assert RELATED not in json.dumps(result)


# "When sent, the notifications/tasks/status notification SHOULD NOT include the
# io.modelcontextprotocol/related-task metadata, as the task ID is already present" and "The
# notification includes the full Task object".
def test_status_notification_should_not_include_related_task_meta(client: McpClient) -> None:
    task = client.call_task("demo_sleep", {"ms": 200})
    reply = client.request("tasks/result", {"taskId": task["taskId"]})
    statuses = [n for n in reply.notifications if n["method"] == "notifications/tasks/status"]
    assert statuses, "no status notification on the tasks/result stream"
    for n in statuses:
        assert RELATED not in json.dumps(n)
        assert n["params"]["taskId"] == task["taskId"]
        assert_task_object(n["params"])


# "the taskId parameter in the request MUST be used as the source of truth for identifying the
# target task ... receivers MUST ignore such metadata if present in favor of the RPC method parameter."
def test_receiver_must_use_task_id_param_over_related_task_meta(client: McpClient) -> None:
    a = client.call_task("demo_sleep", {"ms": 10})
    b = client.call_task("demo_sleep", {"ms": 5000})
    meta = {RELATED: {"taskId": b["taskId"]}}
    assert client.request("tasks/get", {"taskId": a["taskId"], "_meta": meta}).result["taskId"] == a["taskId"]
    wait_status(client, a["taskId"], *TERMINAL)
    res = client.request("tasks/result", {"taskId": a["taskId"], "_meta": meta}).result
    assert res["_meta"][RELATED] == {"taskId": a["taskId"]}
    client.request("tasks/cancel", {"taskId": b["taskId"], "_meta": {RELATED: {"taskId": a["taskId"]}}})
    assert get(client, b["taskId"])["status"] == "cancelled"
    assert get(client, a["taskId"])["status"] == "completed"


# === Listing ===================================================================================

# "Receivers SHOULD use cursor-based pagination to limit the number of tasks returned in a single
# response." "Receivers MUST include a nextCursor in the response if more tasks are available."
# "If a task is retrievable via tasks/get for a requestor, it MUST be retrievable via tasks/list."
def test_tasks_list_must_paginate_with_next_cursor_and_include_every_task(
    stack: Stack, server: Proc
) -> None:
    token = stack.token("acme", "lister")
    with McpClient(server.url, token=token) as c:
        c.initialize()
        created = [c.call_task("demo_sleep", {"ms": 1})["taskId"] for _ in range(2 * PAGE_SIZE + 1)]
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            page = c.request("tasks/list", {"cursor": cursor} if cursor else {}).result
            pages += 1
            assert len(page["tasks"]) <= PAGE_SIZE
            seen += [t["taskId"] for t in page["tasks"]]
            cursor = page.get("nextCursor")
            if cursor is None:
                break
            assert len(page["tasks"]) == PAGE_SIZE
        for tid in created:
            assert get(c, tid)["taskId"] == tid
    assert sorted(seen) == sorted(created)  # each exactly once
    assert pages == 3


# "Requestors MUST treat cursors as opaque tokens" / "Invalid or nonexistent cursor in tasks/list:
# -32602 (Invalid params)": a tampered or foreign cursor is refused.
def test_receiver_must_reject_invalid_cursor_with_32602(alice: McpClient, bob: McpClient) -> None:
    for _ in range(PAGE_SIZE + 1):
        alice.call_task("demo_sleep", {"ms": 1})
    cursor = alice.request("tasks/list", {}).result["nextCursor"]
    tampered = cursor[:-2] + ("AA" if not cursor.endswith("AA") else "BB")
    for bad in (tampered, "not-a-cursor", ""):
        assert alice.request("tasks/list", {"cursor": bad}).error["code"] == -32602
    assert bob.request("tasks/list", {"cursor": cursor}).error["code"] == -32602  # another principal's


# === Access control =============================================================================

# "When an authorization context is provided, receivers MUST bind tasks to said context." "receivers
# MUST reject tasks/get, tasks/result, and tasks/cancel requests for tasks that do not belong to the
# same authorization context as the requestor. For tasks/list requests, receivers MUST ensure the
# returned task list includes only tasks associated with the requestor's authorization context."
def test_receiver_must_bind_tasks_to_authorization_context(
    alice: McpClient, bob: McpClient, server: Proc, tokens: dict[str, str]
) -> None:
    task = alice.call_task("demo_sleep", {"ms": 3000})
    tid = task["taskId"]
    with McpClient(server.url, token=tokens["eve"]) as eve, McpClient(server.url) as anon:
        eve.initialize()
        anon.initialize()
        for other in (bob, eve, anon):
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                err = other.request(method, {"taskId": tid}).error
                assert err == {"code": -32602, "message": "Failed to retrieve task: Task not found"}
        for other in (bob, eve):
            listed = other.request("tasks/list", {}).result["tasks"]
            assert tid not in {t["taskId"] for t in listed}
    assert tid in {t["taskId"] for t in alice.request("tasks/list", {}).result["tasks"]}
    assert get(alice, tid)["status"] == "working"  # the foreign cancel did nothing
    alice.request("tasks/cancel", {"taskId": tid})


# "Receivers SHOULD: Enforce limits on concurrent tasks per requestor".  The per-principal limit
# of a tenant (Tenant.max_concurrent_tasks_per_principal) refuses the next task with -32010 until a
# slot frees up.
def test_receiver_should_enforce_concurrent_task_limit_per_requestor(stack: Stack, server: Proc) -> None:
    token = stack.token("limited", "carol")
    db_json(stack, "Tenant.objects.filter(slug='limited').update(max_concurrent_tasks_per_principal=1)",
            "from tenants.models import Tenant")
    with McpClient(server.url, token=token) as c:
        c.initialize()
        first = c.call_task("demo_sleep", {"ms": 10_000})
        refused = c.call("demo_sleep", {"ms": 1}, task={})
        assert refused.error["code"] == -32010
        assert refused.error["data"]["scope"] == "principal"
        c.request("tasks/cancel", {"taskId": first["taskId"]})
        assert c.call_task("demo_sleep", {"ms": 1})["status"] == "working"


# "Receivers SHOULD implement rate limiting on task operations to prevent denial-of-service and
# enumeration attacks."
def test_receiver_should_rate_limit_task_operations(stack: Stack, server: Proc) -> None:
    token = stack.token("ratelimited", "dave")
    db_json(stack, "Tenant.objects.filter(slug='ratelimited').update(rate_read_per_min=3)",
            "from tenants.models import Tenant")
    with McpClient(server.url, token=token) as c:
        c.initialize()
        statuses = [c.request("tasks/get", {"taskId": f"guess-{i}"}) for i in range(6)]
    limited = [r for r in statuses if r.status == 429]
    assert limited, [r.status for r in statuses]
    assert limited[0].error["code"] == -32011


# "Receivers SHOULD: Log task creation, completion, and retrieval events for audit purposes" and
# "Include auth context in logs when available".
def test_receiver_should_log_task_lifecycle_for_audit(stack: Stack, alice: McpClient) -> None:
    task = alice.call_task("demo_sleep", {"ms": 10})
    alice.request("tasks/result", {"taskId": task["taskId"]})
    rows = db_json(
        stack,
        f"list(AuditEvent.objects.filter(task_id={task['taskId']!r}).values('action', 'principal__identifier'))",
        "from mcptasks.models import AuditEvent",
    )
    actions = {r["action"] for r in rows}
    assert {"task.create", "task.completed"} <= actions
    assert all(r["principal__identifier"] for r in rows)


# === Cancellation ==============================================================================

# "Receivers MUST reject cancellation requests for tasks already in a terminal status (completed,
# failed, or cancelled) with error code -32602 (Invalid params)." with the example message
# "Cannot cancel task: already in terminal status 'completed'".
def test_receiver_must_reject_cancel_of_terminal_task_with_32602(client: McpClient) -> None:
    done = client.call_task("demo_sleep", {"ms": 1})
    failed = client.call_task("demo_fail", {})
    cancelled = client.call_task("demo_sleep", {"ms": 5000})
    client.request("tasks/cancel", {"taskId": cancelled["taskId"]})
    for task, status in ((done, "completed"), (failed, "failed"), (cancelled, "cancelled")):
        wait_status(client, task["taskId"], status)
        err = client.request("tasks/cancel", {"taskId": task["taskId"]}).error
        assert err == {"code": -32602, "message": f"Cannot cancel task: already in terminal status '{status}'"}


# "Upon receiving a valid cancellation request, receivers ... MUST transition the task to cancelled
# status before sending the response."
def test_receiver_must_transition_task_to_cancelled_before_responding(client: McpClient) -> None:
    task = client.call_task("demo_sleep", {"ms": 10_000})
    reply = client.request("tasks/cancel", {"taskId": task["taskId"]})
    assert reply.result["status"] == "cancelled"
    assert reply.result["taskId"] == task["taskId"]
    assert get(client, task["taskId"])["status"] == "cancelled"


# "Upon receiving a valid cancellation request, receivers SHOULD attempt to stop the task execution"
def test_receiver_should_attempt_to_stop_task_execution_on_cancel(stack: Stack, client: McpClient) -> None:
    key = "stop-" + str(time.time_ns())
    task = client.call_task("test_counted_once", {"key": key, "ms": 2500})
    wait_until(lambda: "start" in run_events(stack, key), timeout=20, interval=0.05)
    client.request("tasks/cancel", {"taskId": task["taskId"]})
    time.sleep(3.0)  # past the tool's natural end: the absence of "end" is what we check
    assert run_events(stack, key) == ["start"]
    assert get(client, task["taskId"])["status"] == "cancelled"


# "Once a task is cancelled, it MUST remain in cancelled status even if execution continues to
# completion or fails."  test_ignores_cancel never looks at the cancel signal and runs to the end.
def test_cancelled_task_must_remain_cancelled_even_if_execution_completes(stack: Stack, client: McpClient) -> None:
    key = "late-" + str(time.time_ns())
    task = client.call_task("test_ignores_cancel", {"key": key, "ms": 1500})
    wait_until(lambda: "start" in run_events(stack, key), timeout=20, interval=0.05)
    cancelled = client.request("tasks/cancel", {"taskId": task["taskId"]}).result
    wait_until(lambda: run_events(stack, key) == ["start", "end"], timeout=20, interval=0.1)
    after = get(client, task["taskId"])
    assert after["status"] == "cancelled"
    assert after["lastUpdatedAt"] == cancelled["lastUpdatedAt"]
    assert client.request("tasks/result", {"taskId": task["taskId"]}).error["code"] == -32603


# "Requestors SHOULD NOT rely on receiving this notification"; receivers MAY send it.  This server
# sends notifications/tasks/status on the task's tasks/result stream (else the session's GET stream).
def test_receiver_may_send_status_notifications_with_full_task(client: McpClient) -> None:
    task = client.call_task("demo_sleep", {"ms": 300})
    reply: Reply = client.request("tasks/result", {"taskId": task["taskId"]})
    final = [n["params"] for n in reply.notifications if n["method"] == "notifications/tasks/status"]
    assert final and final[-1]["status"] == "completed"
    assert final[-1]["ttl"] == DEFAULT_TTL_MS and final[-1]["pollInterval"] == DEFAULT_POLL_MS
