"""Drive mcptasks with FastMCP 4's client and its tasks extension (fastmcp-tasks), in its own venv.

Run by tests/e2e/test_sdk_fastmcp.py as ``<venv>/bin/python fastmcp_drive.py URL``; prints one JSON
object with what the client saw. FastMCP negotiates 2026-07-28 (stateless, per-request _meta),
declares io.modelcontextprotocol/tasks, and drives a task that elicits: tasks/get until
input_required, the elicitation handler's answer through tasks/update, then the inlined result.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import fastmcp_tasks  # noqa: F401  (registers the client half of the tasks extension)
from fastmcp import Client
from fastmcp_tasks import call_tool_task


async def main(url: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"elicitations": []}

    async def on_elicit(message: str, response_type: Any, params: Any, context: Any) -> dict[str, Any]:
        seen["elicitations"].append(message)
        return {"confirm": True}

    async with Client(url, elicitation_handler=on_elicit) as client:
        seen["protocol_version"] = getattr(client, "protocol_version", None) or str(
            getattr(getattr(client, "session", None), "protocol_version", ""))
        tools = await client.list_tools()
        seen["tools"] = sorted(t.name for t in tools)[:3]
        # Transparent: call_tool returns the tool's real result after the task completes.
        result = await client.call_tool("confirm_delete", {"filename": "fastmcp.txt"})
        seen["transparent_text"] = result.content[0].text  # type: ignore[union-attr]
        # Explicit handle: the task id is the server's, readable by tasks/get.
        task = await call_tool_task(client, "slow_compute", {"seconds": 0.2, "label": "fastmcp"})
        seen["task_id"] = task.task_id
        seen["explicit_text"] = (await task.result()).content[0].text  # type: ignore[union-attr]
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
