"""Server-Sent Events framing."""

from __future__ import annotations


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
