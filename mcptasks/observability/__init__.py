"""Traces, structured logs and the process's Prometheus metric objects, for every process role.

:mod:`.tracing` (OpenTelemetry spans), :mod:`.logs` (JSON log lines) and :mod:`.metrics` (the
counters and registrations that any layer records into; ``GET /metrics`` and its collectors
live in :mod:`mcptasks.console.metrics`). The names below are the package's API.

The switches :data:`TRACING` and :data:`JSON_LOGS` are read here live from their modules; set
them there (``observability.logs.JSON_LOGS = True``), never on this package.
"""

from __future__ import annotations

from typing import Any

from mcptasks.observability import logs, tracing
from mcptasks.observability.logs import JsonFormatter, bind_log, clip, redact, start_request_log
from mcptasks.observability.tracing import (
    _OFF,
    current_traceparent,
    note_task,
    principal_hash,
    rpc_span,
    setup_tracing,
    span,
    task_run,
    task_span,
    tracing_requested,
    valid_traceparent,
    wrap_asgi,
)

#: Read from their modules at every access, so a flag flipped at run time is seen here.
_SWITCHES = {"TRACING": tracing, "JSON_LOGS": logs, "MESSAGE_MAX_CHARS": logs}


def __getattr__(name: str) -> Any:
    if name in _SWITCHES:
        return getattr(_SWITCHES[name], name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "_OFF", "JsonFormatter", "bind_log", "clip", "current_traceparent", "logs", "note_task", "principal_hash",
    "redact", "rpc_span", "setup_tracing", "span", "start_request_log", "task_run", "task_span", "tracing",
    "tracing_requested", "valid_traceparent", "wrap_asgi",
]
