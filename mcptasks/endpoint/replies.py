"""What request handling asks the HTTP layer to send: the vocabulary between an era and the consumer.

An era's request path (:mod:`mcptasks.endpoint.eras`, the admission pipeline) never holds
the consumer: it returns one of these and the consumer writes it. That keeps the HTTP
connection, its CORS headers and its stream bookkeeping in one place.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcptasks.methods.listen import Listen

#: Writes one SSE frame to the open response.
SendFrame = Callable[[bytes], Awaitable[None]]


@dataclass(frozen=True)
class JsonReply:
    """A complete response: ``payload`` as JSON (None: an empty body without a content type)."""

    status: int
    payload: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SseReply:
    """A short SSE response, not resumable: ``produce`` sends its frames through the function it
    is given and returns the last one, which ends the response."""

    produce: Callable[[SendFrame], Awaitable[bytes]]


@dataclass(frozen=True)
class ListenReply:
    """A 2026-07-28 ``subscriptions/listen`` the consumer serves as a long-lived stream."""

    listen: Listen


Reply = JsonReply | SseReply | ListenReply
