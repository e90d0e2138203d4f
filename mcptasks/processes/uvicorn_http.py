"""uvicorn's httptools protocol, sending a response's head and body in one write.

uvicorn writes the status line and headers when the application sends ``http.response.start``
and the body when it sends ``http.response.body``: two ``send()`` calls, two TCP segments
(asyncio sets ``TCP_NODELAY``), and a client that wakes for the head only to wait for the body.
Every MCP answer is a head and a body sent in the same step of the event loop, so each paid a
system call and a client wake-up for nothing (issue 27: the web processes' largest self time
was their socket sends).

Run uvicorn with ``--http mcptasks.processes.uvicorn_http:HttpToolsProtocol``
(docs/operations.md). The head of a response is held until the next write on the connection,
which joins it; if none comes in the same step (a stream whose first event comes later), it is
sent on the next pass of the loop. Nothing else about the protocol changes.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http import httptools_impl


class _CoalescingTransport:
    """A transport that holds a response head (a write starting ``HTTP/``) until the next write
    or the loop's next pass, then sends the two together. Everything else passes through."""

    __slots__ = ("_held", "_loop", "_scheduled", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            data, self._held = self._held + bytes(data), None
            self._transport.write(data)
        elif data[:5] == b"HTTP/" and not self._transport.is_closing():
            self._held = bytes(data)
            if not self._scheduled:
                self._scheduled = True
                self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        self._scheduled = False
        if self._held is not None:
            data, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HttpToolsProtocol(httptools_impl.HttpToolsProtocol):
    """uvicorn's ``httptools`` protocol whose responses leave in one write (see the module)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance check.
        super().connection_made(_CoalescingTransport(cast(asyncio.Transport, transport), self.loop))  # type: ignore[arg-type]
