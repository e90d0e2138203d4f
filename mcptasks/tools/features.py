"""Resources, resource templates and prompts: the registry's other entries, besides tools."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mcptasks.tools.results import resource_contents, text


@dataclass
class Resource:
    """A static resource."""

    uri: str
    name: str
    fn: Callable[..., Any]
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None

    def definition(self) -> dict[str, Any]:
        """The Resource object of ``resources/list``."""
        return _described({"uri": self.uri, "name": self.name}, self.title, self.description, self.mime_type)

    async def read(self, uri: str, **kwargs: Any) -> list[dict[str, Any]]:
        """The ``contents`` of ``resources/read``."""
        return resource_contents(uri, await _call(self.fn, **kwargs), self.mime_type)


@dataclass
class ResourceTemplate:
    """A parameterised resource."""

    uri_template: str
    name: str
    fn: Callable[..., Any]
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    complete: dict[str, Callable[[str], list[str]]] = field(default_factory=dict)

    def definition(self) -> dict[str, Any]:
        """The ResourceTemplate object of ``resources/templates/list``."""
        out = {"uriTemplate": self.uri_template, "name": self.name}
        return _described(out, self.title, self.description, self.mime_type)

    def match(self, uri: str) -> dict[str, str] | None:
        """Variables of ``uri`` if it matches this template."""
        pattern = "^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.uri_template)) + "$"
        m = re.match(pattern, uri)
        return m.groupdict() if m else None

    async def read(self, uri: str, variables: dict[str, str]) -> list[dict[str, Any]]:
        """The ``contents`` of ``resources/read`` for a matching URI."""
        return resource_contents(uri, await _call(self.fn, **variables), self.mime_type)


def _described(out: dict[str, Any], title: str | None, description: str | None,
               mime_type: str | None) -> dict[str, Any]:
    """Add the optional descriptive members, omitting empty ones (clients reject nulls)."""
    if title:
        out["title"] = title
    if description:
        out["description"] = description
    if mime_type:
        out["mimeType"] = mime_type
    return out


async def _call(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """Call a sync or async resource/prompt function."""
    value = fn(**kwargs)
    if inspect.isawaitable(value):
        value = await value
    return value


@dataclass
class Prompt:
    """A prompt template."""

    name: str
    fn: Callable[..., Any]
    title: str | None
    description: str
    arguments: list[dict[str, Any]]
    complete: dict[str, Callable[[str], list[str]]] = field(default_factory=dict)

    def definition(self) -> dict[str, Any]:
        """The Prompt object of ``prompts/list``."""
        out: dict[str, Any] = {"name": self.name, "arguments": self.arguments}
        if self.title:
            out["title"] = self.title
        if self.description:
            out["description"] = self.description
        return out

    async def render(self, arguments: dict[str, str]) -> dict[str, Any]:
        """The GetPromptResult."""
        value = await _call(self.fn, **arguments)
        if isinstance(value, str):
            value = [{"role": "user", "content": text(value)}]
        if isinstance(value, dict):
            return value
        out: dict[str, Any] = {"messages": value}
        if self.description:
            out["description"] = self.description
        return out
