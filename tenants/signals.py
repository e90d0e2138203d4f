"""Signals the tenants app sends; the MCP app records them in its audit log.

``tenants`` never imports ``mcptasks``: security events (refused scopes, non-members at the
authorization endpoint, throttled sign-ins) are announced here, and whoever keeps the audit
log listens.
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

#: Sent with ``action`` (str), ``tenant_id`` (int | None) and ``data`` (dict of short strings).
security_event = Signal()


def emit(*, action: str, tenant_id: int | None, data: dict[str, Any]) -> None:
    """Announce a security event (never raises into the caller)."""
    security_event.send_robust(sender=None, action=action, tenant_id=tenant_id, data=data)
