"""FastMCP 3.4.x peer for bench/tasks_get.py: a `demo_sleep` tool with task support, the
in-memory task backend (Docket's `memory://`), JSON responses, on uvicorn.

Runs in its own virtualenv (bench/tasks_get.py makes it: ``pip install "fastmcp<4"``).
Usage: ``python bench/peers/fastmcp_server.py PORT``.
"""

from __future__ import annotations

import asyncio
import sys

from fastmcp import FastMCP

mcp = FastMCP("bench-fastmcp")


@mcp.tool(task=True)
async def demo_sleep(ms: int = 1) -> str:
    """Sleep for ms milliseconds."""
    await asyncio.sleep(ms / 1000)
    return f"Slept for {ms} ms"


if __name__ == "__main__":
    mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), json_response=True, log_level="warning")
