"""JSON-RPC and MCP error codes, defined once, and the exception that carries them."""

from __future__ import annotations

from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# MCP-specific codes.
RESOURCE_NOT_FOUND = -32002
URL_ELICITATION_REQUIRED = -32042
# Implementation-defined server errors (JSON-RPC reserves -32000..-32099 for these).
QUOTA_EXCEEDED = -32010
RATE_LIMITED = -32011
CAPABILITY_MISSING = -32012
REQUEST_CANCELLED = -32800
# 2026-07-28 (SEP-2243, SEP-2575): answered with HTTP 400.
HEADER_MISMATCH = -32020
MISSING_CLIENT_CAPABILITY = -32021  # formerly -32003 in drafts of the tasks extension
UNSUPPORTED_PROTOCOL_VERSION = -32022

# Messages the tasks spec words exactly.
TASK_NOT_FOUND = "Failed to retrieve task: Task not found"
TASK_EXPIRED = "Failed to retrieve task: Task has expired"


def cannot_cancel_message(status: str) -> str:
    """The spec's message for cancelling a task that is already terminal."""
    return f"Cannot cancel task: already in terminal status '{status}'"


class McpError(Exception):
    """A JSON-RPC error to send to the peer: ``code``, ``message`` and optional ``data``."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_error(self) -> dict[str, Any]:
        """The ``error`` member of a JSON-RPC error response."""
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err

    @classmethod
    def from_error(cls, error: dict[str, Any]) -> McpError:
        """Rebuild an error from the ``error`` member of a JSON-RPC response."""
        return cls(int(error.get("code", INTERNAL_ERROR)), str(error.get("message", "")), error.get("data"))

    def __repr__(self) -> str:
        return f"McpError({self.code}, {self.message!r})"


def invalid_params(message: str, data: Any = None) -> McpError:
    """Shorthand for a -32602 error."""
    return McpError(INVALID_PARAMS, message, data)


def payload_too_large(limit: int) -> McpError:
    """The refusal of a body over ``limit`` bytes (HTTP 413), wherever the limit is enforced."""
    return McpError(INVALID_REQUEST, f"Payload Too Large: the limit is {limit} bytes")
