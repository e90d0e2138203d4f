"""The method table declares each method's rules; one table answers every exception."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from mcptasks.endpoint.errors import PASSTHROUGH, TABLE, answer
from mcptasks.methods.era2025 import dispatcher, operation_class, required_scope
from mcptasks.protocol.errors import INTERNAL_ERROR, INVALID_PARAMS, McpError
from mcptasks.protocol.messages import CLIENT_NOTIFICATIONS, CancelledNotificationParams
from tenants.exceptions import QuotaExceeded, RateLimited


@pytest.mark.parametrize(("method", "params", "scope", "rate"), [
    ("initialize", {}, None, "other"),
    ("ping", {}, None, "other"),
    ("tools/list", {}, "mcp:tools", "other"),
    ("tools/call", {"name": "x"}, "mcp:tools", "other"),
    ("tools/call", {"name": "x", "task": {}}, "mcp:tasks", "create"),
    ("tasks/get", {}, "mcp:tasks", "read"),
    ("tasks/result", {}, "mcp:tasks", "read"),
    ("tasks/list", {}, "mcp:tasks", "read"),
    ("tasks/cancel", {}, "mcp:tasks", "other"),
    ("resources/read", {}, None, "other"),
    ("no/such/method", {}, None, "other"),
])
def test_routes_declare_scope_and_rate(method: str, params: dict[str, object], scope: str | None, rate: str) -> None:
    assert required_scope(method, params) == scope
    assert operation_class(method, params) == rate


def test_only_initialize_and_ping_come_before_initialization() -> None:
    early = [m for m in dispatcher.methods if dispatcher.route(m).before_init]  # type: ignore[union-attr]
    assert early == ["initialize", "ping"]


def test_every_refusal_has_its_code_and_status() -> None:
    limited = RateLimited(retry_after_s=3, limit=1, op_class="read", window_s=60)
    assert answer(limited)[1:] == (429, {"Retry-After": "3"})
    quota = QuotaExceeded("Concurrency limit reached", {"limit": 1, "scope": "tenant"})
    error, status, _ = answer(quota)
    assert (error.code, status, error.message) == (-32010, 200, "Concurrency limit reached")
    error, status, headers = answer(OperationalError("server closed the connection: secret detail"))
    assert (error.code, status, headers) == (INTERNAL_ERROR, 503, {"Retry-After": "5"})
    assert "secret" not in error.message  # the driver's text never reaches the client
    own = McpError(INVALID_PARAMS, "bad")
    assert answer(own) == (own, 200, {})
    crash, status, _ = answer(KeyError("x"))
    assert (crash.code, crash.message, status) == (INTERNAL_ERROR, "Internal error", 500)
    # What the table answers is what handlers may let escape to the transport.
    assert set(PASSTHROUGH) == {r.exc for r in TABLE} - {McpError}


def test_notifications_have_models() -> None:
    assert CLIENT_NOTIFICATIONS["notifications/cancelled"] is CancelledNotificationParams
    with pytest.raises(ValueError):
        CancelledNotificationParams.model_validate({"requestId": True})
    assert CancelledNotificationParams.model_validate({"requestId": 7, "reason": "bored"}).requestId == 7
