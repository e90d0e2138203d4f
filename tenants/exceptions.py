"""Exceptions of the tenants app: authentication failures and tenants' refusals.

The transport's one error table (``mcptasks.endpoint.errors``) maps each to its JSON-RPC code
and HTTP status; ``data`` is the structured detail it sends along.
"""

from __future__ import annotations

from typing import Any


class AuthError(Exception):
    """Authentication failed; the consumer answers with ``status``, ``headers`` and ``body``."""

    def __init__(
        self, status: int, message: str, headers: dict[str, str] | None = None, body: Any = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.body = body


class TenantRefusal(Exception):
    """A request refused by a tenant's limits: ``message`` for people, ``data`` for programs."""

    def __init__(self, message: str, data: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class RateLimited(TenantRefusal):
    """Over the tenant's per-minute budget for an operation class; retry after ``retry_after_s``.

    ``data`` is ``{"limit": N, "opClass": ..., "retryAfterS": S, "windowS": 60}``.
    """

    def __init__(self, *, retry_after_s: int, limit: int, op_class: str, window_s: int) -> None:
        self.retry_after_s = retry_after_s
        self.limit = limit
        self.op_class = op_class
        super().__init__(
            f"Rate limit exceeded: at most {limit} {op_class} requests per minute for this tenant; "
            f"retry after {retry_after_s} s",
            {"limit": limit, "opClass": op_class, "retryAfterS": retry_after_s, "windowS": window_s},
        )

    def retry_headers(self) -> dict[str, str]:
        """``Retry-After`` in whole seconds."""
        return {"Retry-After": str(self.retry_after_s)}


class QuotaExceeded(TenantRefusal):
    """A concurrency quota is reached. ``data`` is ``{"limit": N, "scope": "tenant" | "principal"}``."""
