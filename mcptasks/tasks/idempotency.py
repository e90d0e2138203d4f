"""Retried task creations return the task of the first attempt instead of a second one.

A client that times out and retries a task-augmented ``tools/call`` must not run the tool
twice. Two ways to say "this is the same creation", both scoped to the tenant and principal
(another principal's identical key is independent):

- ``params._meta["io.mcptasks/idempotencyKey"]``: a string of 1 to 255 characters chosen by
  the client, the same for every attempt (any revision, any session);
- on 2025-11-25 without it, the session and the JSON-RPC request id: ids are never reused
  within a session, so a request arriving again with the same id is a retry.

Only a hash of either is stored (``Task.idempotency_key``); a unique constraint on (tenant,
principal, key) makes concurrent duplicates safe: the second insert waits for the first to
commit, fails, and the caller returns the stored task (:func:`mcptasks.tasks.creation.create_task`).
A key reused for another tool or other arguments is refused (-32602), not silently answered
with an unrelated task. Once the task is deleted (its ttl), the key may create a new one.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from mcptasks.protocol.errors import INVALID_PARAMS, McpError

#: The ``_meta`` key a client sets to make a creation idempotent.
META_KEY = "io.mcptasks/idempotencyKey"
MAX_KEY_CHARS = 255


def from_request(*, meta: dict[str, Any] | None, session_id: str | None, request_id: Any) -> str | None:
    """The stored key of a task creation: from the client's ``_meta`` key, else from the
    session and JSON-RPC id (``session_id=None``: none, e.g. 2026-07-28 without a key)."""
    raw = (meta or {}).get(META_KEY)
    if raw is not None:
        if not isinstance(raw, str) or not 1 <= len(raw) <= MAX_KEY_CHARS:
            raise McpError(INVALID_PARAMS, f"_meta[{META_KEY!r}] must be a string of 1 to {MAX_KEY_CHARS} characters")
        return _digest("key", raw)
    if session_id is None or request_id is None:
        return None
    return _digest("rpc", session_id, json.dumps(request_id))


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def mismatch() -> McpError:
    """The refusal of a key reused for a different creation."""
    return McpError(INVALID_PARAMS, "This idempotency key (or request id) was already used for a different tool call")
