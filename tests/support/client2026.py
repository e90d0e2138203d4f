"""A minimal MCP 2026-07-28 client for the tests: per-request ``_meta`` and the SEP-2243 headers."""

from __future__ import annotations

import itertools
import time
from typing import Any

import httpx

VERSION = "2026-07-28"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
_NAME_SOURCE = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri",
                "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
_ids = itertools.count(1)


class Client2026:
    """Sends one POST per request; no session, no handshake."""

    def __init__(self, url: str, *, capabilities: dict[str, Any] | None = None, token: str | None = None) -> None:
        self.url = url
        self.capabilities = capabilities if capabilities is not None else {}
        self.token = token
        self.http = httpx.Client(timeout=30)

    def __enter__(self) -> Client2026:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.http.close()

    def send(self, method: str, params: dict[str, Any] | None = None, *,
             capabilities: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON-RPC response) of one request."""
        params = dict(params or {})
        caps = self.capabilities if capabilities is None else capabilities
        meta = {"io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientCapabilities": caps,
                "io.modelcontextprotocol/clientInfo": {"name": "mcptasks-tests", "version": "1"}}
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": VERSION, "Mcp-Method": method}
        source = _NAME_SOURCE.get(method)
        if source and isinstance(params.get(source), str):
            headers["Mcp-Name"] = params[source]
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        body = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": {**params, "_meta": meta}}
        response = self.http.post(self.url, json=body, headers=headers)
        return response.status_code, response.json()

    def result(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        """The result of a request that must succeed."""
        status, message = self.send(method, params, **kw)
        assert status == 200 and "result" in message, (status, message)
        return dict(message["result"])

    def wait_status(self, task_id: str, wanted: set[str], timeout: float = 20) -> dict[str, Any]:
        """Poll tasks/get until the task's status is one of ``wanted``."""
        deadline = time.monotonic() + timeout
        while True:
            task = self.result("tasks/get", {"taskId": task_id})
            if task["status"] in wanted or time.monotonic() > deadline:
                return task
            time.sleep(0.1)
