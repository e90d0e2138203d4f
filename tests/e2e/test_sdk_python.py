"""The official Python SDK (``mcp==1.30.0``, experimental task client) against a real daphne.

The SDK creates a task, polls it to ``input_required``, then calls ``tasks/result``: the
server delivers ``elicitation/create`` (with the related-task ``_meta``) on that stream, the
SDK's elicitation callback answers it with a POST, and the same stream ends with the result.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.support.requirements import REQUIRE_SERVICES
from tests.support.servers import Proc

try:
    import mcp  # noqa: F401
except ImportError:  # a missing package fails in CI (MCPTASKS_REQUIRE_SERVICES=1), never skips silently
    if REQUIRE_SERVICES:
        raise
    pytest.skip("the official MCP Python SDK (mcp==1.30.0) is not installed", allow_module_level=True)

from mcp import ClientSession, types  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

# mcp 1.30 flags its (working) experimental task client as deprecated ahead of mcp 2.0.
pytestmark = pytest.mark.filterwarnings("ignore:The experimental tasks API:DeprecationWarning")

RELATED = "io.modelcontextprotocol/related-task"


async def _drive_ask(url: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"elicitations": [], "statuses": [], "notifications": []}

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        seen["elicitations"].append(params.model_dump(by_alias=True, exclude_none=True))
        return types.ElicitResult(action="accept", content={"answer": "teal"})

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ServerNotification):
            seen["notifications"].append(message.root.method)

    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(10, read=30)) as http,
        streamable_http_client(url, http_client=http) as (read, write, _sid),
        ClientSession(read, write, elicitation_callback=on_elicit, message_handler=on_message) as session,
    ):
        init = await session.initialize()
        seen["server_tasks_cap"] = init.capabilities.model_dump(exclude_none=True).get("tasks")
        created = await session.experimental.call_tool_as_task("demo_ask", {"question": "Favourite colour?"},
                                                               ttl=60_000)
        task_id = created.task.taskId
        seen["task_id"] = task_id
        async for status in session.experimental.poll_task(task_id):
            seen["statuses"].append(status.status)
            if status.status == "input_required":
                break
        result = await asyncio.wait_for(
            session.experimental.get_task_result(task_id, types.CallToolResult), timeout=30
        )
        seen["result"] = result.model_dump(by_alias=True, exclude_none=True)
        final = await session.experimental.get_task(task_id)
        seen["final_status"] = final.status
    return seen


def test_python_sdk_drives_task_with_elicitation(server: Proc) -> None:
    seen = asyncio.run(asyncio.wait_for(_drive_ask(server.url), timeout=60))
    task_id = seen["task_id"]
    assert seen["server_tasks_cap"]["requests"] == {"tools": {"call": {}}}
    # Polling saw the task waiting for input (never the request itself: that is on tasks/result).
    assert seen["statuses"][-1] == "input_required"
    assert set(seen["statuses"]) <= {"working", "input_required"}
    assert len(seen["elicitations"]) == 1
    elicitation = seen["elicitations"][0]
    assert elicitation["message"] == "Favourite colour?"
    assert elicitation["_meta"][RELATED] == {"taskId": task_id}
    result = seen["result"]
    assert result["content"] == [{"type": "text", "text": "teal"}]
    assert result["_meta"][RELATED] == {"taskId": task_id}
    assert seen["final_status"] == "completed"
