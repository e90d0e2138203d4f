"""2026-07-28 gaps (issue 25 item 11), driven in-process over the real ASGI router.

A tenant-wide reader must not read the owner's ``inputRequests`` (elicitation text, sampling
prompts); an ``mcp:tools``-only token must not answer a task's input through the
gather-input-first ``requestState`` retry; a repeated SEP-2243 header is refused (-32020).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import channel_layers
from channels.testing import HttpCommunicator

from mcptasks.asgi import router
from mcptasks.methods import request_state as state
from mcptasks.models import Task, TaskMessage
from mcptasks.protocol.era2026 import TASKS_EXTENSION
from mcptasks.tasks import messages
from tenants import services as tenant_services
from tenants.auth import AuthContext
from tests.support.factories import make_tenant

pytestmark = [pytest.mark.django_db(transaction=True)]

V = "2026-07-28"
TASKS_CAPS = {"elicitation": {}, "extensions": {TASKS_EXTENSION: {}}}
SECRET_PROMPT = "Enter the launch code for project NIGHTJAR"


@pytest.fixture(autouse=True)
def _layer(settings: Any) -> Iterator[None]:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends = {}
    yield
    channel_layers.backends = {}


async def post(method: str, params: dict[str, Any], *, token: str,
               headers: list[tuple[str, str]] | None = None) -> tuple[int, dict[str, Any]]:
    """One 2026-07-28 POST; ``headers`` replaces the SEP-2243 ones (repeats allowed)."""
    meta = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": TASKS_CAPS}
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": meta}}
    if headers is None:
        headers = [("mcp-protocol-version", V), ("mcp-method", method)]
        name = params.get("taskId") or params.get("name")
        if isinstance(name, str):
            headers.append(("mcp-name", name))
    base = [("host", "127.0.0.1:8000"), ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"), ("authorization", f"Bearer {token}")]
    comm = HttpCommunicator(router, "POST", "/mcp", body=json.dumps(body).encode(),
                            headers=[(k.encode(), v.encode()) for k, v in base + headers])
    response = await comm.get_response(timeout=20)
    return response["status"], json.loads(response["body"])


def _owner_task_waiting_for_input() -> tuple[Any, Task, AuthContext]:
    """A tenant, a task of its principal ``owner`` that asks the owner a question, owner's auth."""
    tenant = make_tenant()
    owner_token = tenant_services.issue_token(tenant=tenant, principal_name="owner")
    from tenants.auth import authenticate

    auth = authenticate(headers={"authorization": f"Bearer {owner_token}"}, query_string="",
                        resource_url="http://127.0.0.1:8000/mcp")
    from tests.support.factories import make_task

    task = make_task(auth)
    messages.add_task_message(task=task, method="elicitation/create", params={
        "message": SECRET_PROMPT, "requestedSchema": {"type": "object", "properties": {"code": {"type": "string"}}},
        "_meta": {"io.mcptasks/inputKey": "code"},
    })
    task.refresh_from_db()
    return tenant, task, auth


async def test_a_tenant_wide_reader_sees_the_status_but_not_the_owners_input_requests() -> None:
    tenant, task, _auth = await sync_to_async(_owner_task_waiting_for_input)()
    owner = await sync_to_async(tenant_services.issue_token)(tenant=tenant, principal_name="owner")
    reader = await sync_to_async(tenant_services.issue_token)(
        tenant=tenant, principal_name="reader", scopes=["mcp:tools", "mcp:tasks", "mcp:tasks:tenant"])
    status, mine = await post("tasks/get", {"taskId": task.task_id}, token=owner)
    assert status == 200 and SECRET_PROMPT in json.dumps(mine["result"]["inputRequests"])
    status, theirs = await post("tasks/get", {"taskId": task.task_id}, token=reader)
    assert status == 200 and theirs["result"]["status"] == "input_required"
    assert "inputRequests" not in theirs["result"] and SECRET_PROMPT not in json.dumps(theirs)


async def test_a_tools_only_token_cannot_answer_a_tasks_input_through_request_state() -> None:
    tenant, task, auth = await sync_to_async(_owner_task_waiting_for_input)()
    # The same principal, with a token narrowed to mcp:tools (it may not touch tasks).
    narrow = await sync_to_async(tenant_services.issue_token)(tenant=tenant, principal_name="owner",
                                                              scopes=["mcp:tools"])
    issued = state.issue(auth=auth, task_id=task.task_id, tool=task.tool_name, round_=1, kind="task")
    status, msg = await post("tools/call", {"name": task.tool_name, "requestState": issued,
                                            "inputResponses": {"code": {"action": "accept",
                                                                        "content": {"code": "0000"}}}},
                             token=narrow)
    assert status == 403 and "result" not in msg
    pending = await sync_to_async(TaskMessage.objects.filter(task=task, answered_at__isnull=True).count)()
    assert pending == 1


@pytest.mark.parametrize("repeated", [
    [("mcp-method", "tools/list"), ("mcp-method", "tools/call")],
    [("mcp-method", "tools/list"), ("MCP-Protocol-Version", V), ("mcp-protocol-version", "2025-11-25")],
    [("mcp-method", "tools/list"), ("Mcp-Param-Region", "eu"), ("mcp-param-region", "us")],
])
async def test_repeated_sep2243_headers_are_refused(repeated: list[tuple[str, str]]) -> None:
    tenant = await sync_to_async(make_tenant)()
    token = await sync_to_async(tenant_services.issue_token)(tenant=tenant, principal_name="c")
    headers = [("mcp-protocol-version", V), *repeated] if repeated[1][0] != "MCP-Protocol-Version" else repeated
    status, msg = await post("tools/list", {}, token=token, headers=headers)
    assert status == 400 and msg["error"]["code"] == -32020


async def test_a_repeated_mcp_name_is_refused() -> None:
    tenant, task, _auth = await sync_to_async(_owner_task_waiting_for_input)()
    owner = await sync_to_async(tenant_services.issue_token)(tenant=tenant, principal_name="owner")
    headers = [("mcp-protocol-version", V), ("mcp-method", "tasks/get"), ("mcp-name", task.task_id),
               ("mcp-name", "something-else")]
    status, msg = await post("tasks/get", {"taskId": task.task_id}, token=owner, headers=headers)
    assert status == 400 and msg["error"]["code"] == -32020
