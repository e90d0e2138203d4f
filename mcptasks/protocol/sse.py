"""Server-Sent Events framing, and the response headers of every SSE response of the endpoint."""

from __future__ import annotations

#: The headers that open an SSE response (CORS headers are added by the caller): no caching or
#: transformation by intermediaries, and no response buffering by nginx-style proxies.
HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
)


def event(data: str, *, event_id: str | None = None, retry_ms: int | None = None) -> bytes:
    """One SSE event. ``data`` is a single line of JSON (or empty for a priming event)."""
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    if retry_ms is not None:
        lines.append(f"retry: {retry_ms}")
    for line in data.split("\n") if data else [""]:
        lines.append(f"data: {line}")
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def comment(text: str = "keep-alive") -> bytes:
    """An SSE comment line: keeps idle connections (and proxies) from timing out."""
    return f": {text}\n\n".encode()


def retry(retry_ms: int) -> bytes:
    """A bare ``retry:`` field, sent before the server closes a connection it wants resumed."""
    return f"retry: {retry_ms}\n\n".encode()
