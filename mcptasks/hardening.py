"""Process-level safety rails: a real SECRET_KEY outside development, no tokens in access logs."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

DEV_SECRET_PREFIX = "dev-insecure-"
_dev_server = False


def allow_dev_secret_key() -> None:
    """``manage.py serve`` (the local development server) may run with the development key."""
    global _dev_server
    _dev_server = True


def require_production_secret_key(role: str) -> None:
    """Refuse to start a serving process (web, worker) with the public development key.

    Allowed only under ``manage.py serve``, in tests, or with ``DEBUG`` on: the key signs
    task-list cursors and admin sessions, and the development one is published in the source.
    """
    if settings.DEBUG or _dev_server or "pytest" in sys.modules:
        return
    key = str(settings.SECRET_KEY)
    if key.startswith(DEV_SECRET_PREFIX) or len(key) < 32:
        raise ImproperlyConfigured(
            f"The {role} refuses to start without a real SECRET_KEY (at least 32 characters, not the "
            "development default). Set SECRET_KEY in the environment, or use `manage.py serve` for development."
        )


def redact_target(target: str) -> str:
    """A request target safe to log: the path, with any query string replaced."""
    path, sep, _query = target.partition("?")
    return f"{path}?<redacted>" if sep else path


def install_access_log_redaction() -> None:
    """Make daphne's access log print paths without query strings (tokens never reach it).

    Daphne's NCSA access log (on by default) prints the full request target; a client that
    puts ``?access_token=...`` in the URL is refused, but the token would already be logged.
    """
    try:
        from daphne.access import AccessLogGenerator
    except ImportError:  # another ASGI server
        return
    if getattr(AccessLogGenerator, "_mcptasks_redacted", False):
        return
    original = AccessLogGenerator.write_entry

    def write_entry(self: Any, host: Any, date: Any, request: str, *args: Any, **kwargs: Any) -> Any:
        method, _, target = str(request).partition(" ")
        return original(self, host, date, f"{method} {redact_target(target)}", *args, **kwargs)

    AccessLogGenerator.write_entry = write_entry
    AccessLogGenerator._mcptasks_redacted = True


def _payload_too_large(limit: int) -> bytes:
    # Imported when first needed: Django's logging set-up loads this module (for its filter)
    # before settings are complete; the protocol layer needs nothing of that.
    from mcptasks.protocol.jsonrpc import payload_too_large_body

    body = payload_too_large_body(limit)
    return (
        b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )


def install_body_limit() -> None:
    """Make daphne refuse an oversize request body while it arrives, not after buffering it.

    Twisted reads the whole body (into memory or a temporary file) before the application is
    called, so an application-level limit comes too late: a 200 MB POST cost ~200 MB and
    seconds. This answers 413 and closes the connection as soon as ``Content-Length`` or the
    received bytes pass ``MCPTASKS_MAX_BODY_BYTES`` (plus 64 KiB for framing).
    """
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:  # another ASGI server: its own limits apply (see docs)
        return
    if getattr(WebRequest, "_mcptasks_body_limit", False):
        return
    from mcptasks import conf

    original_got_length = WebRequest.gotLength
    original_chunk = WebRequest.handleContentChunk

    def refuse(self: Any) -> None:
        self._mcptasks_refused = True
        limit = conf.get().MAX_BODY_BYTES
        transport = self.channel.transport
        transport.write(_payload_too_large(limit))
        transport.loseConnection()

    def got_length(self: Any, length: int | None) -> None:
        self._mcptasks_received = 0
        self._mcptasks_refused = False
        if length is not None and length > conf.get().MAX_BODY_BYTES + 65536:
            original_got_length(self, 0)
            refuse(self)
            return
        original_got_length(self, length)

    def handle_chunk(self: Any, data: bytes) -> None:
        if getattr(self, "_mcptasks_refused", False):
            return
        self._mcptasks_received = getattr(self, "_mcptasks_received", 0) + len(data)
        if self._mcptasks_received > conf.get().MAX_BODY_BYTES + 65536:
            refuse(self)
            return
        original_chunk(self, data)

    WebRequest.gotLength = got_length
    WebRequest.handleContentChunk = handle_chunk
    WebRequest._mcptasks_body_limit = True


class ClientErrorsWithoutTraceback(logging.Filter):
    """Drop the traceback Django attaches to 4xx responses on ``django.request``.

    A 403 from the admin (``PermissionDenied``) or a 400 (``SuspiciousOperation``) is the
    client's mistake: one line says so; a traceback would flood the log and tell an operator
    nothing. 5xx records keep theirs.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep the record; strip exc_info when its response was a client error."""
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500:
            record.exc_info = None
            record.exc_text = None
        return True
