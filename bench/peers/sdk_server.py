"""The peer: the official Python SDK (mcp 1.30) low-level server with enable_tasks().

JSON responses, in-memory task store, served by uvicorn. Usage: ``python sdk_server.py PORT [sse]``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp.types as types
import uvicorn
from mcp.server.experimental.task_context import ServerTaskContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

server: Server[Any, Any] = Server("sdk-peer")
server.experimental.enable_tasks()


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    return [types.Tool(name="demo_sleep", description="Sleep for ms milliseconds.",
                       inputSchema={"type": "object", "properties": {"ms": {"type": "integer"}}},
                       execution=types.ToolExecution(taskSupport="optional"))]


@server.call_tool()
async def call_tool(name: str, arguments: dict[str, Any]) -> Any:
    ms = int(arguments.get("ms", 0))

    async def work(task: ServerTaskContext) -> types.CallToolResult:
        await anyio.sleep(ms / 1000)
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"Slept for {ms} ms")])

    ctx = server.request_context
    if ctx.experimental.is_task:
        return await ctx.experimental.run_task(work)
    await anyio.sleep(ms / 1000)
    return [types.TextContent(type="text", text=f"Slept for {ms} ms")]


# JSON responses by default; SSE responses (one event per answer) with a second argument "sse".
manager = StreamableHTTPSessionManager(app=server, json_response=not (len(sys.argv) > 2 and sys.argv[2] == "sse"))


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    async with manager.run():
        yield


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        message = await receive()
        if message["type"] == "lifespan.startup":
            async with lifespan():
                await send({"type": "lifespan.startup.complete"})
                message = await receive()
            await send({"type": "lifespan.shutdown.complete"})
        return
    await manager.handle_request(scope, receive, send)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
