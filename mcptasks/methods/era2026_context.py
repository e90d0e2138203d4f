"""What a 2026-07-28 handler gets about its request (:class:`EraContext`), and the refusal of a
request that lacks a client capability."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mcptasks.methods import era2025 as legacy
from mcptasks.protocol import era2026
from mcptasks.protocol.era2026 import TASKS_EXTENSION, RequestMeta
from mcptasks.protocol.errors import INTERNAL_ERROR, MISSING_CLIENT_CAPABILITY, McpError
from mcptasks.tools.registry import Registry, registry
from tenants.auth import AuthContext


@dataclass
class EraContext:
    """What a 2026-07-28 handler may use about the request."""

    auth: AuthContext
    meta: RequestMeta
    request_id: str | int
    registry: Registry = field(default_factory=lambda: registry)

    def legacy(self) -> legacy.RequestContext:
        """A 2025-11-25 context for the shared handlers that only read the registry."""
        async def no_stream(prefix: str, *, before_priming: Callable[[str], Awaitable[None]] | None = None) -> str:
            raise McpError(INTERNAL_ERROR, "Internal error")

        return legacy.RequestContext(
            auth=self.auth, session=None, protocol_version=era2026.VERSION, request_id=self.request_id,
            open_stream=no_stream, registry=self.registry,
        )


def missing_capability(capabilities: dict[str, Any], what: str) -> McpError:
    """-32021 naming the capabilities the client must declare (a ClientCapabilities object)."""
    return McpError(MISSING_CLIENT_CAPABILITY, f"Missing required client capability: {what}",
                    {"requiredCapabilities": capabilities})


TASKS_REQUIRED: dict[str, Any] = {"extensions": {TASKS_EXTENSION: {}}}
