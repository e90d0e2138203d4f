"""The one table from exception to (JSON-RPC code, HTTP status): every refusal the transport sends.

Handlers and services raise what they mean (``McpError`` with its own code, a tenant's
``RateLimited`` or ``QuotaExceeded``, a database outage); :func:`answer` turns any of them into
the JSON-RPC error and the HTTP status and headers that carry it, for either era of the endpoint
(the 2026-07-28 revision carries a few JSON-RPC codes in a 400 or 404, see
:data:`STATUS_BY_CODE`). Anything not in the table is a crash: -32603 "Internal error", logged
with its traceback, never shown to the client. What a database outage raises is named by the
tasks layer (:mod:`mcptasks.tasks.outage`): this module never imports the ORM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcptasks.protocol import era2026
from mcptasks.protocol.errors import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    MISSING_CLIENT_CAPABILITY,
    QUOTA_EXCEEDED,
    RATE_LIMITED,
    UNSUPPORTED_PROTOCOL_VERSION,
    McpError,
)
from mcptasks.tasks.outage import DATABASE_UNAVAILABLE, database_unavailable
from tenants.exceptions import QuotaExceeded, RateLimited

#: The eras of the one endpoint: the session-based revisions (2025-11-25 and earlier) and the
#: stateless 2026-07-28 one.
SESSION_ERA = "session"
ERA_2026 = era2026.VERSION


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
    *(Rule(exc, INTERNAL_ERROR, 503, headers=lambda exc: {"Retry-After": "5"},
           message="Service temporarily unavailable") for exc in DATABASE_UNAVAILABLE),
    Rule(McpError, None, 200),
)

#: JSON-RPC errors (by code) an era carries in another status than the rule's: the 2026-07-28
#: revision answers header, client-capability and version errors with 400 (SEP-2243/2575) and an
#: unknown method with 404. The session-based era answers every ``McpError`` in a 200.
STATUS_BY_CODE: dict[str, dict[int, int]] = {
    ERA_2026: {HEADER_MISMATCH: 400, MISSING_CLIENT_CAPABILITY: 400, UNSUPPORTED_PROTOCOL_VERSION: 400,
               METHOD_NOT_FOUND: 404},
}

#: Exceptions a handler may let escape for the transport to answer (all but McpError, which
#: the dispatcher passes through anyway).
PASSTHROUGH: tuple[type[Exception], ...] = tuple(
    r.exc for r in TABLE if r.exc is not McpError and issubclass(r.exc, Exception)
)
#: A database outage, answered 503 wherever it surfaces.
UNAVAILABLE: tuple[type[Exception], ...] = DATABASE_UNAVAILABLE


def rule_for(exc: BaseException) -> Rule | None:
    """The first rule whose exception type ``exc`` is, or None (a crash)."""
    return next((r for r in TABLE if isinstance(exc, r.exc)), None)


def answer(exc: BaseException, *, era: str = SESSION_ERA) -> tuple[McpError, int, dict[str, str]]:
    """The JSON-RPC error, HTTP status and headers for ``exc`` in ``era`` (-32603 / 500 when unknown)."""
    rule = rule_for(exc)
    if rule is None:
        return McpError(INTERNAL_ERROR, "Internal error"), 500, {}
    headers = rule.headers(exc) if rule.headers is not None else {}
    if isinstance(exc, McpError) and rule.code is None:
        return exc, STATUS_BY_CODE.get(era, {}).get(exc.code, rule.status), headers
    message = rule.message or getattr(exc, "message", None) or str(exc)
    data = None if rule.message else getattr(exc, "data", None)
    return McpError(rule.code if rule.code is not None else INTERNAL_ERROR, message, data), rule.status, headers


def unavailable() -> tuple[McpError, int, dict[str, str]]:
    """How a database outage is answered (503 with ``Retry-After``), once it was caught and logged."""
    return answer(database_unavailable())
