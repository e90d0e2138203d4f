"""Input rounds for code that runs inside the web process (prompts), not in a worker.

A prompt that needs the client's input calls :func:`require` with the requests it needs; in
the 2026-07-28 era the handler has put the round's ``inputResponses`` in place and either
gets the answers back or turns the raised :class:`NeedsInput` into an InputRequiredResult.
A session-based (2025-11-25) client has no such rounds and gets a plain -32602.
"""

from __future__ import annotations

import contextvars
from typing import Any

from mcptasks.protocol.errors import INVALID_PARAMS, McpError

_responses: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("era2026_inputs", default=None)


class NeedsInput(McpError):
    """The code needs answers the client has not given yet (``requests``: key -> {method, params})."""

    def __init__(self, requests: dict[str, dict[str, Any]]) -> None:
        super().__init__(INVALID_PARAMS, "This request needs client input, which only 2026-07-28 clients can give")
        self.requests = requests


def provide(responses: dict[str, Any] | None) -> contextvars.Token[dict[str, Any] | None]:
    """Make a round's ``inputResponses`` available to :func:`require` (reset with the token)."""
    return _responses.set(dict(responses or {}))


def reset(token: contextvars.Token[dict[str, Any] | None]) -> None:
    """Undo :func:`provide`."""
    _responses.reset(token)


def require(requests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The answers to ``requests`` by key, or :class:`NeedsInput` naming those still missing."""
    given = _responses.get() or {}
    missing = {k: v for k, v in requests.items() if not isinstance(given.get(k), dict)}
    if missing:
        raise NeedsInput(missing)
    return {k: given[k] for k in requests}
