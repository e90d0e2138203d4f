"""A minimal MCP 2026-07-28 client for the tests: per-request ``_meta`` and the SEP-2243 headers."""

from __future__ import annotations

import contextlib
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


class ListenStream:
    """A ``subscriptions/listen`` read in a background thread: every SSE message, as parsed JSON.

    ``status`` is the HTTP status (an error answer is read whole into ``messages``); ``ended`` is
    set when the server closed the response.
    """

    def __init__(self, client: Client2026, notifications: dict[str, Any], *,
                 capabilities: dict[str, Any] | None = None) -> None:
        import threading

        self.messages: list[dict[str, Any]] = []
        self.status = 0
        self.request_id = next(_ids)
        self.ended = threading.Event()
        self._opened = threading.Event()
        self._stop = False
        caps = client.capabilities if capabilities is None else capabilities
        self._body = {"jsonrpc": "2.0", "id": self.request_id, "method": "subscriptions/listen", "params": {
            "notifications": notifications,
            "_meta": {"io.modelcontextprotocol/protocolVersion": VERSION,
                      "io.modelcontextprotocol/clientCapabilities": caps}}}
        self._headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                         "MCP-Protocol-Version": VERSION, "Mcp-Method": "subscriptions/listen"}
        if client.token:
            self._headers["Authorization"] = f"Bearer {client.token}"
        self._url = client.url
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._opened.wait(30)

    def _run(self) -> None:
        import json

        from tests.support.client import iter_sse

        try:
            with httpx.stream("POST", self._url, json=self._body, headers=self._headers,
                              timeout=httpx.Timeout(30, read=None)) as response:
                self.status = response.status_code
                self._response = response
                self._opened.set()
                if not response.headers.get("content-type", "").startswith("text/event-stream"):
                    self.messages.append(json.loads(response.read()))
                    return
                for event in iter_sse(response.iter_lines()):
                    if self._stop:
                        return
                    if not isinstance(event, str) and event.data:
                        self.messages.append(json.loads(event.data))
        except httpx.HTTPError:
            pass
        finally:
            self._opened.set()
            self.ended.set()

    def close(self) -> None:
        """Drop the connection (the client side of a network failure)."""
        self._stop = True
        response = getattr(self, "_response", None)
        if response is not None:
            with contextlib.suppress(Exception):  # closing from another thread: the reader ends
                response.close()
        self.ended.wait(10)

    def of(self, method: str) -> list[dict[str, Any]]:
        """The messages of ``method`` received so far."""
        return [m for m in list(self.messages) if m.get("method") == method]

    def task_states(self, task_id: str) -> list[dict[str, Any]]:
        """Every ``notifications/tasks`` params received for ``task_id``, in order."""
        return [m["params"] for m in self.of("notifications/tasks") if m["params"].get("taskId") == task_id]

    def wait(self, predicate: Any, timeout: float = 20) -> bool:
        """Wait until ``predicate(self)`` holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.05)
        return bool(predicate(self))
