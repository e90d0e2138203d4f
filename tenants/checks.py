"""System checks for the tenants app."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Warning, register

from mcptasks import conf as mcp_conf


@register()
def anonymous_without_debug(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """tenants.W001: anonymous access is on while DEBUG is off (a production-like setup)."""
    if mcp_conf.get().ALLOW_ANONYMOUS and not settings.DEBUG:
        return [
            Warning(
                "MCPTASKS_ALLOW_ANONYMOUS is on with DEBUG off: anyone who can reach the server "
                f"acts as the anonymous principal of tenant {mcp_conf.get().DEFAULT_TENANT!r}.",
                hint="Unset MCPTASKS_ALLOW_ANONYMOUS and issue tokens (manage.py mcptasks_tenant token).",
                id="tenants.W001",
            )
        ]
    return []
