"""The load generators' HTTP client: one MCP JSON-RPC POST, over httpx or aiohttp.

The benches share their machine's cores with the servers they measure, so the load generator's
own CPU per request takes cores from the target. httpx spends about 1.5-2 ms of CPU per request
here (``bench/RESULTS.md``, issue 27, eighth session: 5.1-6.0 ms per task of three requests);
aiohttp about a third of that. ``--client`` picks one; both send the same requests, keep one
connection per caller alive and read JSON or SSE answers alike, so the servers see the same load.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

ACCEPT = "application/json, text/event-stream"
CLIENTS = ("aiohttp", "httpx")


class LoadClient(Protocol):
    """What a load generator's caller needs: POST a JSON-RPC message, get its response."""

    async def post(self, url: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]: ...

    async def initialize(self, url: str, headers: dict[str, str], body: dict[str, Any]) -> str: ...

    async def aclose(self) -> None: ...


def _answer(body: dict[str, Any], lines: list[str]) -> dict[str, Any]:
    """The JSON-RPC response to ``body`` among an SSE answer's ``data:`` lines."""
    for line in lines:
        if line.startswith("data:") and line[5:].strip():
            msg = json.loads(line[5:])
            if msg.get("id") == body.get("id") and ("result" in msg or "error" in msg):
                return dict(msg)
    raise RuntimeError(f"{body['method']}: stream ended without a response")


class HttpxClient:
    """httpx.AsyncClient (the benches' client until issue 27's ninth session)."""

    def __init__(self, connections: int) -> None:
        import httpx

        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self._client = httpx.AsyncClient(timeout=60, limits=limits)

    async def post(self, url: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        async with self._client.stream("POST", url, headers=headers, json=body) as resp:
            if resp.status_code >= 400:
                raise RuntimeError(f"{body['method']}: HTTP {resp.status_code} {(await resp.aread())[:200]!r}")
            if resp.status_code == 202:
                return {}
            if resp.headers.get("content-type", "").startswith("application/json"):
                return dict(json.loads(await resp.aread()))
            return _answer(body, [line async for line in resp.aiter_lines()])

    async def initialize(self, url: str, headers: dict[str, str], body: dict[str, Any]) -> str:
        resp = await self._client.post(url, headers=headers, json=body)
        resp.raise_for_status()
        return resp.headers.get("mcp-session-id", "")

    async def aclose(self) -> None:
        await self._client.aclose()


class AiohttpClient:
    """aiohttp.ClientSession: the same requests for about a third of httpx's CPU."""

    def __init__(self, connections: int) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(
            # Idle connections are dropped before uvicorn's 5 s keep-alive timeout: a POST on one the
            # server was closing failed ("Server disconnected"), once or twice a run of create_load,
            # whose clients wait 6 s between opening their sessions and the start.
            connector=aiohttp.TCPConnector(limit=connections, ttl_dns_cache=None, keepalive_timeout=4),
            timeout=aiohttp.ClientTimeout(total=60))

    async def post(self, url: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        async with self._session.post(url, headers=headers, data=json.dumps(body)) as resp:
            if resp.status >= 400:
                raise RuntimeError(f"{body['method']}: HTTP {resp.status} {(await resp.read())[:200]!r}")
            if resp.status == 202:
                await resp.read()
                return {}
            if resp.content_type == "application/json":
                return dict(json.loads(await resp.read()))
            return _answer(body, (await resp.read()).decode().splitlines())

    async def initialize(self, url: str, headers: dict[str, str], body: dict[str, Any]) -> str:
        async with self._session.post(url, headers=headers, data=json.dumps(body)) as resp:
            resp.raise_for_status()
            await resp.read()
            return resp.headers.get("mcp-session-id", "")

    async def aclose(self) -> None:
        await self._session.close()


def make_client(kind: str, connections: int) -> LoadClient:
    """A client of ``kind`` (one of :data:`CLIENTS`) keeping up to ``connections`` alive."""
    if kind == "httpx":
        return HttpxClient(connections)
    if kind == "aiohttp":
        return AiohttpClient(connections)
    raise ValueError(f"unknown client {kind!r}; one of {', '.join(CLIENTS)}")


async def open_session(client: LoadClient, url: str, token: str) -> dict[str, str]:
    """``initialize`` + ``notifications/initialized`` (2025-11-25): the headers for the session."""
    base = {"Accept": ACCEPT, "Content-Type": "application/json"}
    if token:
        base["Authorization"] = f"Bearer {token}"
    session_id = await client.initialize(url, base, {
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "1"}}})
    headers = {**base, "Mcp-Session-Id": session_id, "MCP-Protocol-Version": "2025-11-25"}
    await client.post(url, headers, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    return headers
