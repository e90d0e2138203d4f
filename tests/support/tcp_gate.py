"""A TCP relay that holds back a client's ``BEGIN`` to see whether it waits for the answer.

Between a database client and PostgreSQL (or PgBouncer): everything is relayed as is, except
that once the client's bytes contain ``BEGIN`` the relay forwards nothing more from the client
until those bytes also contain ``marker`` (sent without waiting for an answer to ``BEGIN``) or
``hold_s`` has passed (the client was waiting for the answer: a separate round trip). Which of
the two happened is recorded in :attr:`TcpGate.same_flight`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class TcpGate:
    """One-connection relay from a free loopback port to ``upstream``."""

    def __init__(self, upstream: tuple[str, int], marker: bytes, *, hold_s: float = 1.0) -> None:
        self.upstream = upstream
        self.marker = marker
        self.hold_s = hold_s
        self.same_flight: bool | None = None  # None: no BEGIN seen
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.upstream)
                self._socks += [client, server]
                for target in (self._client_to_server, self._server_to_client):
                    t = threading.Thread(target=target, args=(client, server), daemon=True)
                    t.start()
                    self._threads.append(t)

    def _server_to_client(self, client: socket.socket, server: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                client.sendall(data)

    def _client_to_server(self, client: socket.socket, server: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self.same_flight is None and b"BEGIN" in data:
                    held = data
                    client.settimeout(0.05)
                    deadline = time.monotonic() + self.hold_s
                    while self.marker not in held[held.index(b"BEGIN"):] and time.monotonic() < deadline:
                        with contextlib.suppress(TimeoutError):
                            more = client.recv(65536)
                            if not more:
                                break
                            held += more
                    client.settimeout(None)
                    self.same_flight = self.marker in held[held.index(b"BEGIN"):]
                    data = held
                server.sendall(data)

    def close(self) -> None:
        """Stop listening and drop every relayed connection."""
        self.listener.close()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()
