"""Peer: FastMCP 3.4 with a background-task tool (``task=True``: Docket, in-memory backend).

Runs in its own virtualenv (FastMCP pins its own ``mcp``): ``bench/throughput.py`` creates it
under ``var/bench-fastmcp`` on first use. Usage: ``python fastmcp_server.py PORT``.
"""

from __future__ import annotations

import asyncio
import sys

import uvicorn
from fastmcp import FastMCP

mcp = FastMCP("fastmcp-peer")


@mcp.tool(task=True)
async def demo_sleep(ms: int = 0) -> str:
    """Sleep for ms milliseconds."""
    await asyncio.sleep(ms / 1000)
    return f"Slept for {ms} ms"


if __name__ == "__main__":
    uvicorn.run(mcp.http_app(path="/mcp", json_response=True), host="127.0.0.1", port=int(sys.argv[1]),
                log_level="warning")
