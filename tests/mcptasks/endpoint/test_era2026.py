"""The 2026-07-28 era on the one endpoint, driven in-process with Channels' HttpCommunicator.

Era selection, the ``_meta`` and SEP-2243 header rules and their HTTP statuses, discovery and
cache hints, the tasks extension over the shared store (tasks created in either era read and
cancelled from the other), input rounds with signed ``requestState``, and that another
principal's task or state is indistinguishable from a missing one. Flows that need a worker (input
rounds, a task with elicitation) run end to end against daphne: tests/e2e/test_era2026.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import HttpCommunicator

from mcptasks.asgi import router
from mcptasks.models import Task
from mcptasks.protocol.era2026 import TASKS_EXTENSION
from tenants import services as tenant_services
from tests.support.factories import make_tenant
from tests.support.schema2026 import validate_response

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("anonymous_in_memory")]

V = "2026-07-28"
TASKS_CAPS = {"elicitation": {}, "extensions": {TASKS_EXTENSION: {}}}
NAME_SOURCE = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri",
               "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}


def headers_for(method: str, params: dict[str, Any], *, token: str | None = None,
                **override: str | None) -> list[tuple[bytes, bytes]]:
    hdrs: dict[str, str | None] = {
        "host": "127.0.0.1:8000", "content-type": "application/json",
        "accept": "application/json, text/event-stream", "mcp-protocol-version": V, "mcp-method": method,
    }
    source = NAME_SOURCE.get(method)
    if source and isinstance(params.get(source), str):
        hdrs["mcp-name"] = params[source]
    if token:
        hdrs["authorization"] = f"Bearer {token}"
    hdrs.update({k.replace("_", "-"): v for k, v in override.items()})
    return [(k.encode(), v.encode()) for k, v in hdrs.items() if v is not None]


def with_meta(params: dict[str, Any], caps: dict[str, Any] | None) -> dict[str, Any]:
    meta = {"io.modelcontextprotocol/protocolVersion": V,
            "io.modelcontextprotocol/clientCapabilities": caps if caps is not None else {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}
    return {**params, "_meta": {**meta, **(params.get("_meta") or {})}}


async def call(method: str, params: dict[str, Any] | None = None, *, caps: dict[str, Any] | None = None,
               rid: int = 1, token: str | None = None, meta: bool = True, timeout: float = 20,
               **hdrs: str | None) -> tuple[int, dict[str, Any]]:
    """One 2026-07-28 request; (HTTP status, decoded JSON-RPC message)."""
    params = dict(params or {})
    body_params = with_meta(params, caps) if meta else params
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": body_params}
    comm = HttpCommunicator(router, "POST", "/mcp", body=json.dumps(body).encode(),
                            headers=headers_for(method, params, token=token, **hdrs))
    response = await comm.get_response(timeout=timeout)
    message = json.loads(response["body"])
    validate_response(message, method)
    return response["status"], message


# --- era selection, _meta and headers -----------------------------------------------------------


async def test_discover_lists_both_eras_and_the_tasks_extension_without_legacy_tasks() -> None:
    status, msg = await call("server/discover")
    assert status == 200
    result = msg["result"]
    assert result["resultType"] == "complete"
    assert result["supportedVersions"][0] == V and "2025-11-25" in result["supportedVersions"]
    assert result["capabilities"]["extensions"] == {TASKS_EXTENSION: {}}
    assert "tasks" not in result["capabilities"]
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcptasks"
    assert isinstance(result["ttlMs"], int) and result["cacheScope"] == "private"


async def test_lists_carry_result_type_and_cache_hints_and_no_legacy_execution() -> None:
    status, msg = await call("tools/list")
    assert status == 200
    result = msg["result"]
    assert result["resultType"] == "complete" and "ttlMs" in result and "cacheScope" in result
    assert result["tools"] and all("execution" not in t for t in result["tools"])
    _, again = await call("tools/list")
    assert [t["name"] for t in again["result"]["tools"]] == [t["name"] for t in result["tools"]]


@pytest.mark.parametrize("meta", [
    None,
    {"io.modelcontextprotocol/clientCapabilities": {}},
    {"io.modelcontextprotocol/protocolVersion": V},
    {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": "all"},
])
async def test_missing_or_malformed_meta_is_400_with_invalid_params_and_the_id(meta: Any) -> None:
    params = {} if meta is None else {"_meta": meta}
    status, msg = await call("server/discover", params, meta=False, rid=41)
    assert status == 400
    assert msg["error"]["code"] == -32602 and msg["id"] == 41


async def test_client_info_is_optional() -> None:
    params = {"_meta": {"io.modelcontextprotocol/protocolVersion": V,
                        "io.modelcontextprotocol/clientCapabilities": {}}}
    status, msg = await call("server/discover", params, meta=False)
    assert status == 200 and msg["result"]["resultType"] == "complete"


async def test_unsupported_version_is_400_with_the_supported_list_and_the_request_echoed() -> None:
    params = {"_meta": {"io.modelcontextprotocol/protocolVersion": "v999.0.0",
                        "io.modelcontextprotocol/clientCapabilities": {}}}
    status, msg = await call("server/discover", params, meta=False, rid=9, mcp_protocol_version="v999.0.0")
    assert status == 400 and msg["id"] == 9
    assert msg["error"]["code"] == -32022
    assert msg["error"]["data"]["requested"] == "v999.0.0" and V in msg["error"]["data"]["supported"]


@pytest.mark.parametrize("override", [
    {"mcp_protocol_version": None},
    {"mcp_protocol_version": "2025-11-25"},
    {"mcp_method": None},
    {"mcp_method": "tools/list"},
    {"mcp_name": None},
    {"mcp_name": "someone_else"},
])
async def test_header_mismatch_is_400_with_32020(override: dict[str, str | None]) -> None:
    status, msg = await call("tools/call", {"name": "demo_quick", "arguments": {}}, rid=5, **override)
    assert status == 400
    assert msg["error"]["code"] == -32020 and msg["id"] == 5


@pytest.mark.parametrize("method", ["initialize", "ping", "logging/setLevel", "tasks/result", "tasks/list",
                                    "resources/subscribe", "no/such"])
async def test_removed_and_unknown_methods_are_404_with_32601(method: str) -> None:
    params = {"taskId": "abc"} if method.startswith("tasks/") else {}
    status, msg = await call(method, params, rid=7)
    assert status == 404
    assert msg["error"]["code"] == -32601 and msg["id"] == 7


async def test_a_session_based_client_is_served_exactly_as_before() -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}
    hdrs = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
            (b"accept", b"application/json, text/event-stream")]
    response = await HttpCommunicator(router, "POST", "/mcp", body=json.dumps(init).encode(),
                                      headers=hdrs).get_response(timeout=10)
    assert response["status"] == 200
    result = json.loads(response["body"])["result"]
    assert result["protocolVersion"] == "2025-11-25" and "tasks" in result["capabilities"]
    assert "resultType" not in result
    # A session request with an unknown version header is still refused by the 2025 rules.
    sid = dict((k.decode(), v.decode()) for k, v in response["headers"])["mcp-session-id"]
    bad = [*hdrs, (b"mcp-session-id", sid.encode()), (b"mcp-protocol-version", b"2026-07-28")]
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    refused = await HttpCommunicator(router, "POST", "/mcp", body=json.dumps(ping).encode(),
                                     headers=bad).get_response(timeout=10)
    assert refused["status"] == 400


# --- the tasks extension ---------------------------------------------------------------------------


async def test_tasks_methods_need_the_extension_declared() -> None:
    for method in ("tasks/get", "tasks/cancel"):
        status, msg = await call(method, {"taskId": "abc"}, caps={})
        assert msg["error"]["code"] == -32021 and status == 400
        assert msg["error"]["data"]["requiredCapabilities"] == {"extensions": {TASKS_EXTENSION: {}}}


async def test_a_task_only_tool_without_the_extension_is_32021() -> None:
    status, msg = await call("tools/call", {"name": "demo_ask", "arguments": {"question": "q"}}, caps={})
    assert status == 400 and msg["error"]["code"] == -32021


async def test_cancel_then_get_shows_cancelled_and_2025_methods_read_the_same_task() -> None:
    status, created = await call("tools/call", {"name": "demo_ask", "arguments": {"question": "q"}},
                                 caps=TASKS_CAPS)
    task_id = created["result"]["taskId"]
    _, ack = await call("tasks/cancel", {"taskId": task_id}, caps=TASKS_CAPS)
    assert ack["result"] == {"resultType": "complete"}
    _, got = await call("tasks/get", {"taskId": task_id}, caps=TASKS_CAPS)
    assert got["result"]["status"] == "cancelled"
    # The same task through a 2025-11-25 session of the same (anonymous) caller.
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}
    base = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
            (b"accept", b"application/json, text/event-stream")]
    response = await HttpCommunicator(router, "POST", "/mcp", body=json.dumps(init).encode(),
                                      headers=base).get_response(timeout=10)
    sid = dict((k.decode(), v.decode()) for k, v in response["headers"])["mcp-session-id"]
    hdrs = [*base, (b"mcp-session-id", sid.encode()), (b"mcp-protocol-version", b"2025-11-25")]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await HttpCommunicator(router, "POST", "/mcp", body=json.dumps(note).encode(), headers=hdrs).get_response()
    get = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"taskId": task_id}}
    legacy = await HttpCommunicator(router, "POST", "/mcp", body=json.dumps(get).encode(),
                                    headers=hdrs).get_response(timeout=10)
    body = json.loads(legacy["body"])
    assert body["result"]["taskId"] == task_id and body["result"]["status"] == "cancelled"
    assert "ttl" in body["result"] and "resultType" not in body["result"]


async def test_a_task_created_in_2025_is_read_by_2026_tasks_get(task_factory: Any) -> None:
    # The anonymous caller of these tests is the demo tenant's anonymous principal; a task of
    # another principal is invisible (next test), so create this one as the anonymous caller.
    status, created = await call("tools/call", {"name": "demo_ask", "arguments": {"question": "q"}},
                                 caps=TASKS_CAPS)
    task_id = created["result"]["taskId"]
    await sync_to_async(Task.objects.filter(task_id=task_id).update)(status="failed", error=None,
                                                                     result={"content": [], "isError": True})
    _, got = await call("tasks/get", {"taskId": task_id}, caps=TASKS_CAPS)
    # A tool that ran and reported isError is "completed" in this era (failed is for JSON-RPC errors).
    assert got["result"]["status"] == "completed" and got["result"]["result"]["isError"] is True


async def test_another_tenants_task_is_the_same_32602_as_a_missing_one(task_factory: Any) -> None:
    foreign = await sync_to_async(task_factory)()
    tenant = await sync_to_async(make_tenant)()
    token = await sync_to_async(tenant_services.issue_token)(tenant=tenant, principal_name="x")
    _, theirs = await call("tasks/get", {"taskId": foreign.task_id}, caps=TASKS_CAPS, token=token)
    _, missing = await call("tasks/get", {"taskId": "no-such-task"}, caps=TASKS_CAPS, token=token)
    assert theirs["error"] == missing["error"]
    assert theirs["error"]["code"] == -32602
    _, update = await call("tasks/update", {"taskId": foreign.task_id, "inputResponses": {}}, caps=TASKS_CAPS,
                           token=token)
    _, cancel = await call("tasks/cancel", {"taskId": foreign.task_id}, caps=TASKS_CAPS, token=token)
    assert update["error"] == cancel["error"] == missing["error"]
    await sync_to_async(foreign.refresh_from_db)()
    assert foreign.status == "working"


async def test_scopes_apply_as_in_2025() -> None:
    tenant = await sync_to_async(make_tenant)()
    token = await sync_to_async(tenant_services.issue_token)(tenant=tenant, principal_name="c",
                                                             scopes=["mcp:tools"])
    status, msg = await call("tasks/get", {"taskId": "abc"}, caps=TASKS_CAPS, token=token)
    assert status == 403 and msg["id"] == 1
    # Creating a task needs mcp:tasks; the same tool without the extension runs as a plain call.
    status, msg = await call("tools/call", {"name": "demo_progress", "arguments": {"steps": 1}},
                             caps=TASKS_CAPS, token=token)
    assert status == 403


async def test_mcp_name_is_required_on_tasks_methods_unless_the_leniency_is_on(settings: Any) -> None:
    status, absent = await call("tasks/get", {"taskId": "abc"}, caps=TASKS_CAPS, mcp_name=None)
    assert status == 400 and absent["error"]["code"] == -32020  # SEP-2243: a missing header
    settings.MCPTASKS = {**settings.MCPTASKS, "ERA2026_TASKS_NAME_OPTIONAL": True}
    _, absent = await call("tasks/get", {"taskId": "abc"}, caps=TASKS_CAPS, mcp_name=None)
    assert absent["error"]["code"] == -32602  # past the header rules: an unknown task
    _, create = await call("tools/call", {"name": "demo_progress", "arguments": {"steps": 1}}, caps=TASKS_CAPS,
                           mcp_name=None)
    assert create["error"]["code"] == -32020  # only the three tasks methods are lenient
    status, wrong = await call("tasks/get", {"taskId": "abc"}, caps=TASKS_CAPS, mcp_name="other")
    assert status == 400 and wrong["error"]["code"] == -32020
    _, padded = await call("tools/list", {}, mcp_method="  tools/list ")
    assert padded["result"]["resultType"] == "complete"


async def test_an_unknown_resource_is_32602_with_its_uri_in_this_era() -> None:
    status, msg = await call("resources/read", {"uri": "test://nope"})
    assert status == 200
    assert msg["error"]["code"] == -32602 and msg["error"]["data"] == {"uri": "test://nope"}
