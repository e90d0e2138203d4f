"""The documented uvicorn protocol sends a response's head and body in one write."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as StockProtocol
from uvicorn.server import ServerState

from mcptasks.processes.uvicorn_http import HttpToolsProtocol

pytestmark = pytest.mark.fast

REQUEST = b"POST /mcp HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class FakeTransport:
    """Records each write, as a socket would see each ``send()``."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5555)}.get(name, default)


def _answer(body: bytes, *, later: asyncio.Event | None = None) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        headers = [(b"content-type", b"application/json")]
        if later is None:
            headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if later is not None:
            await later.wait()
            await send({"type": "http.response.body", "body": body, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await send({"type": "http.response.body", "body": body})

    return app


async def _serve(protocol_class: type[StockProtocol], app: Any, request: bytes = REQUEST,
                 steps: Any = None) -> FakeTransport:
    config = Config(app=app, lifespan="off", access_log=False, http=protocol_class)
    config.load()
    transport = FakeTransport()
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={},
                              _loop=asyncio.get_running_loop())
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(request)
    if steps is not None:
        await steps(transport)
    for _ in range(20):
        await asyncio.sleep(0)
    protocol.connection_lost(None)
    return transport


async def test_head_and_body_leave_in_one_write() -> None:
    transport = await _serve(HttpToolsProtocol, _answer(b'{"ok":true}'))
    assert len(transport.writes) == 1
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"content-length: 11" in head.lower()
    assert body == b'{"ok":true}'


async def test_uvicorns_own_protocol_writes_twice() -> None:
    """What the subclass changes: the stock protocol sends the head on its own."""
    transport = await _serve(StockProtocol, _answer(b'{"ok":true}'))
    assert len(transport.writes) == 2
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK") and transport.writes[1] == b'{"ok":true}'


async def test_a_head_whose_body_comes_later_is_sent_on_the_next_pass() -> None:
    """A stream's head is not held until its first event: a client sees the 200 at once."""
    later = asyncio.Event()

    async def steps(transport: FakeTransport) -> None:
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(transport.writes) == 1 and transport.writes[0].startswith(b"HTTP/1.1 200 OK")
        later.set()

    transport = await _serve(HttpToolsProtocol, _answer(b"data: 1\n\n", later=later), steps=steps)
    assert transport.writes[0].endswith(b"\r\n\r\n")
    assert b"".join(transport.writes[1:]) == b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"


async def test_a_refused_request_is_answered_before_the_connection_closes() -> None:
    """uvicorn's own error answers (a malformed request) are written, then the transport closed:
    the held head must leave first."""
    transport = await _serve(HttpToolsProtocol, _answer(b"{}"), request=b"NOT HTTP AT ALL\r\n\r\n")
    assert transport.closed
    assert len(transport.writes) == 1 and transport.writes[0].startswith(b"HTTP/1.1 400")


def test_every_documented_uvicorn_command_names_the_protocol() -> None:
    """The docs' web commands and the tests' uvicorn run the same protocol, which imports."""
    from pathlib import Path

    from uvicorn.importer import import_from_string

    from tests.support.servers import UVICORN_PROTOCOL, WEB_SERVERS

    assert import_from_string(UVICORN_PROTOCOL) is HttpToolsProtocol
    assert WEB_SERVERS["uvicorn"](8000)[-3:-1] == ["--http", UVICORN_PROTOCOL]
    docs = Path(__file__).resolve().parents[3] / "docs"
    commands = [line for page in ("operations.md", "overview.md", "workers.md")
                for line in (docs / page).read_text().splitlines() if "uvicorn --host" in line]
    assert len(commands) >= 4
    assert all(f"--http {UVICORN_PROTOCOL} " in line for line in commands)
