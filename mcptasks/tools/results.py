"""What a tool returns, as a ``CallToolResult``: content blocks, :class:`ToolResult`, and the
normalisation of anything else a tool (or a resource function) hands back."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel


@dataclass
class ToolResult:
    """What a tool may return for full control over the ``CallToolResult``."""

    content: list[dict[str, Any]] = field(default_factory=list)
    structured_content: dict[str, Any] | None = None
    is_error: bool = False
    meta: dict[str, Any] | None = None

    def wire(self) -> dict[str, Any]:
        """The CallToolResult JSON."""
        out: dict[str, Any] = {"content": self.content}
        if self.structured_content is not None:
            out["structuredContent"] = self.structured_content
        if self.is_error:
            out["isError"] = True
        if self.meta:
            out["_meta"] = self.meta
        return out


def text(value: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": value}


def image(data: bytes | str, mime_type: str) -> dict[str, Any]:
    """An image content block (bytes are base64-encoded)."""
    return {"type": "image", "data": _b64(data), "mimeType": mime_type}


def audio(data: bytes | str, mime_type: str) -> dict[str, Any]:
    """An audio content block (bytes are base64-encoded)."""
    return {"type": "audio", "data": _b64(data), "mimeType": mime_type}


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data).decode("ascii") if isinstance(data, bytes) else data


class ToolInputError(Exception):
    """Arguments did not match the tool's input schema (reported as an ``isError`` result)."""


def to_call_tool_result(value: Any, structured: bool = False) -> dict[str, Any]:
    """Turn whatever a tool returned into a CallToolResult."""
    if isinstance(value, ToolResult):
        return value.wire()
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
        structured = True
    if isinstance(value, dict) and "content" in value and isinstance(value["content"], list):
        return value
    if value is None:
        return {"content": []}
    if isinstance(value, str):
        return {"content": [text(value)]}
    if isinstance(value, dict) and "type" in value and not structured:
        return {"content": [value]}
    if isinstance(value, list) and all(isinstance(v, dict) and "type" in v for v in value):
        return {"content": value}
    if isinstance(value, dict) and structured:
        return {"content": [text(json.dumps(value))], "structuredContent": value}
    return {"content": [text(json.dumps(value, default=str))]}


def resource_contents(uri: str, value: Any, mime_type: str | None) -> list[dict[str, Any]]:
    """Normalise a resource function's return value into ``contents``."""
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        return [{"uri": uri, **value}]
    item: dict[str, Any] = {"uri": uri}
    if mime_type:
        item["mimeType"] = mime_type
    if isinstance(value, bytes):
        item["blob"] = base64.b64encode(value).decode("ascii")
    else:
        item["text"] = str(value)
    return [item]
