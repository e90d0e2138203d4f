"""Protocol revisions this server speaks and how they are negotiated."""

from __future__ import annotations

LATEST = "2025-11-25"
SUPPORTED: tuple[str, ...] = ("2025-11-25", "2025-06-18", "2025-03-26")
# The transport spec: assume 2025-03-26 when no MCP-Protocol-Version header is sent.
ASSUMED_WHEN_ABSENT = "2025-03-26"


def negotiate(requested: str | None) -> str:
    """Answer a client's requested revision: the same one if supported, else the latest."""
    if requested in SUPPORTED:
        return requested
    return LATEST


def is_supported(version: str) -> bool:
    """Whether an ``MCP-Protocol-Version`` header value is acceptable."""
    return version in SUPPORTED


def has_tasks(version: str) -> bool:
    """Tasks exist from 2025-11-25 on; older clients never see the capability."""
    return version >= "2025-11-25"


def has_elicitation(version: str) -> bool:
    """Elicitation was introduced in 2025-06-18."""
    return version >= "2025-06-18"
