"""The object a tool receives to talk back: progress, logging, elicitation, sampling, cancel.

A :class:`ToolContext` forwards to a backend chosen by where the tool runs (a worker
executing a task or a request); tool code never sees the difference.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class ToolCancelled(Exception):
    """Raised into a tool whose task or request was cancelled."""


class ContextBackend(Protocol):
    """What a runtime provides to a :class:`ToolContext`."""

    @property
    def cancelled(self) -> bool: ...

    async def progress(self, progress: float, total: float | None, message: str | None) -> None: ...

    async def log(self, level: str, data: Any, logger: str | None) -> None: ...

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]: ...

    async def set_status_message(self, message: str) -> None: ...

    def client_supports(self, capability: str) -> bool: ...


class ToolContext:
    """Passed to async tools (a parameter annotated ``ToolContext`` or named ``ctx``)."""

    def __init__(
        self,
        backend: ContextBackend,
        *,
        task_id: str | None = None,
        request_id: str | int | None = None,
        session_id: str | None = None,
        tenant: str | None = None,
        principal: str | None = None,
        attempt: int = 1,
    ) -> None:
        self._backend = backend
        self.task_id = task_id
        self.request_id = request_id
        self.session_id = session_id
        self.tenant = tenant
        self.principal = principal
        self.attempt = attempt

    @property
    def cancelled(self) -> bool:
        """True once the request or task has been cancelled."""
        return self._backend.cancelled

    def check_cancelled(self) -> None:
        """Raise :class:`ToolCancelled` if cancelled; call it in long loops."""
        if self._backend.cancelled:
            raise ToolCancelled("cancelled")

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Send ``notifications/progress`` for the caller's progressToken (if it gave one)."""
        self.check_cancelled()
        await self._backend.progress(progress, total, message)

    async def log(self, level: str, data: Any, logger: str | None = None) -> None:
        """Send ``notifications/message`` (filtered by the session's ``logging/setLevel``)."""
        await self._backend.log(level, data, logger)

    async def debug(self, data: Any) -> None:
        """Log at debug level."""
        await self.log("debug", data)

    async def info(self, data: Any) -> None:
        """Log at info level."""
        await self.log("info", data)

    async def set_status_message(self, message: str) -> None:
        """Set the statusMessage that ``tasks/get`` shows (no-op outside tasks)."""
        self.check_cancelled()
        await self._backend.set_status_message(message)

    async def elicit(
        self, message: str, requested_schema: dict[str, Any], *, key: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        """Ask the user through the client (``elicitation/create``); returns the ElicitResult.

        ``key`` names the request in a 2026-07-28 client's ``inputRequests`` (default: a server
        id); a 2025-11-25 client never sees it.
        """
        self.check_cancelled()
        params: dict[str, Any] = {"message": message, "requestedSchema": requested_schema, **extra}
        if "mode" not in params and "url" not in params:
            params.setdefault("mode", "form")
        return await self._backend.request("elicitation/create", _keyed(params, key))

    async def sample(
        self,
        messages: list[dict[str, Any]] | str,
        *,
        max_tokens: int = 1000,
        key: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Ask the client's model (``sampling/createMessage``); returns the CreateMessageResult."""
        self.check_cancelled()
        if isinstance(messages, str):
            messages = [{"role": "user", "content": {"type": "text", "text": messages}}]
        params: dict[str, Any] = {"messages": messages, "maxTokens": max_tokens, **extra}
        return await self._backend.request("sampling/createMessage", _keyed(params, key))

    async def list_roots(self, *, key: str | None = None) -> dict[str, Any]:
        """Ask the client for its roots (``roots/list``); returns the ListRootsResult."""
        self.check_cancelled()
        return await self._backend.request("roots/list", _keyed({}, key))

    def client_supports(self, capability: str) -> bool:
        """Whether the client declared a capability (``"elicitation"``, ``"sampling"``, ...)."""
        return self._backend.client_supports(capability)

    async def close_stream(self) -> None:
        """Close the client's HTTP connection for a plain call (the stream stays resumable).

        The client reconnects with ``GET`` + ``Last-Event-ID`` and receives the rest, including
        the result. Useful for very long calls behind proxies that cut idle connections.
        """
        closer = getattr(self._backend, "close_stream", None)
        if closer is not None:
            await closer()


#: Where an input request's key travels to the 2026-07-28 adapter (stripped before sending).
INPUT_KEY_META = "io.mcptasks/inputKey"


def _keyed(params: dict[str, Any], key: str | None) -> dict[str, Any]:
    if key is None:
        return params
    meta = dict(params.get("_meta") or {})
    meta[INPUT_KEY_META] = key
    return {**params, "_meta": meta}


class SyncToolContext:
    """The same API for sync tools running in a thread: every call blocks until done."""

    def __init__(self, ctx: ToolContext, loop: asyncio.AbstractEventLoop) -> None:
        self._ctx = ctx
        self._loop = loop
        self.task_id = ctx.task_id
        self.request_id = ctx.request_id
        self.attempt = ctx.attempt

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def cancelled(self) -> bool:
        """True once cancelled."""
        return self._ctx.cancelled

    def check_cancelled(self) -> None:
        """Raise :class:`ToolCancelled` if cancelled."""
        self._ctx.check_cancelled()

    def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Blocking :meth:`ToolContext.report_progress`."""
        self._run(self._ctx.report_progress(progress, total, message))

    def log(self, level: str, data: Any, logger: str | None = None) -> None:
        """Blocking :meth:`ToolContext.log`."""
        self._run(self._ctx.log(level, data, logger))

    def set_status_message(self, message: str) -> None:
        """Blocking :meth:`ToolContext.set_status_message`."""
        self._run(self._ctx.set_status_message(message))

    def elicit(self, message: str, requested_schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """Blocking :meth:`ToolContext.elicit`."""
        return self._run(self._ctx.elicit(message, requested_schema, **extra))

    def sample(self, messages: list[dict[str, Any]] | str, *, max_tokens: int = 1000, **extra: Any) -> dict[str, Any]:
        """Blocking :meth:`ToolContext.sample`."""
        return self._run(self._ctx.sample(messages, max_tokens=max_tokens, **extra))

    def client_supports(self, capability: str) -> bool:
        """Whether the client declared a capability."""
        return self._ctx.client_supports(capability)
