"""The one table from exception to (JSON-RPC code, HTTP status): every refusal the transport sends.

Handlers and services raise what they mean (``McpError`` with its own code, a tenant's
``RateLimited`` or ``QuotaExceeded``, a database outage); :func:`answer` turns any of them into
the JSON-RPC error and the HTTP status and headers that carry it. Anything not in the table is
a crash: -32603 "Internal error", logged with its traceback, never shown to the client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import InterfaceError, OperationalError

from tenants.exceptions import QuotaExceeded, RateLimited

from ..protocol.errors import INTERNAL_ERROR, QUOTA_EXCEEDED, RATE_LIMITED, McpError


@dataclass(frozen=True)
class Rule:
    """How one kind of exception is answered."""

    exc: type[BaseException]
    code: int | None  # None: the exception's own code (McpError)
    status: int
    headers: Callable[[Any], dict[str, str]] | None = None
    message: str | None = None  # a fixed message instead of the exception's


TABLE: tuple[Rule, ...] = (
    Rule(RateLimited, RATE_LIMITED, 429, headers=lambda exc: exc.retry_headers()),
    Rule(QuotaExceeded, QUOTA_EXCEEDED, 200),
    # The database is away: retryable, and never a 500 or a hang.
    Rule(OperationalError, INTERNAL_ERROR, 503, headers=lambda exc: {"Retry-After": "5"},
         message="Service temporarily unavailable"),
    Rule(InterfaceError, INTERNAL_ERROR, 503, headers=lambda exc: {"Retry-After": "5"},
         message="Service temporarily unavailable"),
    Rule(McpError, None, 200),
)

#: Exceptions a handler may let escape for the transport to answer (all but McpError, which
#: the dispatcher passes through anyway).
PASSTHROUGH: tuple[type[Exception], ...] = tuple(
    r.exc for r in TABLE if r.exc is not McpError and issubclass(r.exc, Exception)
)
UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


def rule_for(exc: BaseException) -> Rule | None:
    """The first rule whose exception type ``exc`` is, or None (a crash)."""
    return next((r for r in TABLE if isinstance(exc, r.exc)), None)


def answer(exc: BaseException) -> tuple[McpError, int, dict[str, str]]:
    """The JSON-RPC error, HTTP status and headers for ``exc`` (-32603 / 500 when unknown)."""
    rule = rule_for(exc)
    if rule is None:
        return McpError(INTERNAL_ERROR, "Internal error"), 500, {}
    headers = rule.headers(exc) if rule.headers is not None else {}
    if isinstance(exc, McpError) and rule.code is None:
        return exc, rule.status, headers
    message = rule.message or getattr(exc, "message", None) or str(exc)
    data = None if rule.message else getattr(exc, "data", None)
    return McpError(rule.code if rule.code is not None else INTERNAL_ERROR, message, data), rule.status, headers
