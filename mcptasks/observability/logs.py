"""Structured logs: ``MCPTASKS_LOG_FORMAT=json`` writes one JSON object per line.

Each line carries the request id, tenant, task id and trace id that the request pipeline and the
worker bind (:func:`bind_log`); messages are clipped and anything that looks like a credential is
redacted.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import re
import secrets
from collections.abc import Callable
from typing import Any

#: The log fields bound in this context (request, tenant, task, trace ids).
log_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("mcptasks_log", default=None)

#: Set by settings.py from ``MCPTASKS_LOG_FORMAT``: whether the pipeline binds log context.
JSON_LOGS = False
MESSAGE_MAX_CHARS = 2000
EXCEPTION_MAX_CHARS = 8000
FIELD_MAX_CHARS = 128

#: Credentials a message might carry however it got there: bearer values, JWTs, and the usual
#: OAuth/form parameters. Redacted in JSON lines before anything is written.
_SECRETS = [
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9\-._~+/=]+"), r"\1 [redacted]"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*"), "[redacted-jwt]"),
    (
        re.compile(
            r"(?i)\b(access_token|refresh_token|id_token|client_secret|code_verifier|password|token|code)"
            r"(\"?\s*[=:]\s*\"?)[^\s&\"',;]+"
        ),
        r"\1\2[redacted]",
    ),
]


def bind_log(**fields: Any) -> None:
    """Add fields (``request_id``, ``tenant``, ``task_id``, ``trace_id``) to this context's log lines."""
    current = log_context.get()
    log_context.set({**(current or {}), **fields})


def start_request_log() -> None:
    """A new request: a fresh request id for its log lines (when JSON logs are on)."""
    if JSON_LOGS:
        log_context.set({"request_id": secrets.token_hex(8)})


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text) - limit} more chars]"


def redact(text: str) -> str:
    """``text`` with anything that looks like a credential replaced."""
    for pattern, repl in _SECRETS:
        text = pattern.sub(repl, text)
    return text


def _no_trace_id() -> str | None:
    return None


#: The trace id of the current span, installed by :func:`mcptasks.observability.tracing.setup_tracing`
#: when traces are on (a hook, so that logs need not know about tracing).
current_trace_id: Callable[[], str | None] = _no_trace_id


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the bound context.

    ``request_id``, ``tenant``, ``task_id`` and ``trace_id`` are on every line (null where no
    request or task is in scope). Messages are redacted, then clipped (client strings included),
    so a line is always bounded and never carries a credential.
    """

    def format(self, record: logging.LogRecord) -> str:
        ctx = log_context.get() or {}
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not lose the line
            message = f"{record.msg!r} {record.args!r}"
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": clip(redact(message), MESSAGE_MAX_CHARS),
            "request_id": ctx.get("request_id"),
            "tenant": _field(ctx.get("tenant")),
            "task_id": _field(ctx.get("task_id")),
            "trace_id": current_trace_id() or ctx.get("trace_id"),
        }
        if record.exc_info:
            out["exc"] = clip(redact(self.formatException(record.exc_info)), EXCEPTION_MAX_CHARS)
        return json.dumps(out, default=str)


def _field(value: Any) -> str | None:
    return None if value is None else clip(str(value), FIELD_MAX_CHARS)
