"""A real webhook receiver for tests: an HTTP server thread on 127.0.0.1 that verifies signatures.

It verifies every request with the ``standardwebhooks`` package (as a customer's receiver
would), records what arrived in order, and can be taken down (its socket closed: connections
are refused) and brought back on the same port.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


class _Server(http.server.ThreadingHTTPServer):
    # Restarted on the same port moments after closing it.
    allow_reuse_address = True
    daemon_threads = True


@dataclass
class Received:
    """One verified request."""

    msg_id: str
    event: str
    task_id: str
    status: str
    body: dict[str, Any]
    #: When it arrived (wall clock, for lag measurements).
    at: float = field(default_factory=time.time)


@dataclass
class Receiver:
    """Verifies with ``secret``; ``received`` holds verified requests, ``rejected`` counts the rest."""

    secret: str
    port: int = 0
    status: int = 204
    #: Seconds to hold each verified request before answering (a slow receiver).
    delay: float = 0.0
    received: list[Received] = field(default_factory=list)
    rejected: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: http.server.ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        """Listen (on the same port as before after a :meth:`stop`)."""
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = Webhook(receiver.secret).verify(raw, dict(self.headers.items()))
                except WebhookVerificationError:
                    with receiver.lock:
                        receiver.rejected += 1
                    self.send_response(401)
                    self.end_headers()
                    return
                with receiver.lock:
                    receiver.received.append(Received(
                        msg_id=self.headers["webhook-id"], event=body["type"], task_id=body["data"]["taskId"],
                        status=body["data"]["status"], body=body))
                if receiver.delay:
                    time.sleep(receiver.delay)
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
                return

        self._server = _Server(("127.0.0.1", self.port), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the socket: connections to the port are refused until :meth:`start`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def events_by_task(self) -> dict[str, list[str]]:
        """Each task's events in arrival order, duplicates (same ``webhook-id``) removed."""
        seen: set[str] = set()
        out: dict[str, list[str]] = {}
        with self.lock:
            for r in self.received:
                if r.msg_id in seen:
                    continue
                seen.add(r.msg_id)
                out.setdefault(r.task_id, []).append(r.event)
        return out


def payload_of(raw: bytes) -> dict[str, Any]:
    """A JSON body (for assertions on what was sent)."""
    return dict(json.loads(raw))
