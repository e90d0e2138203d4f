"""The tool-author API: register tools, resources and prompts with decorators.

Example::

    from mcptasks.registry import tool, ToolContext

    @tool(title="Add", task_support="optional")
    async def add(a: int, b: int, ctx: ToolContext) -> str:
        await ctx.report_progress(1, 1)
        return str(a + b)

Modules named ``tools.py`` in installed apps are imported at startup (the way ``admin.py`` is),
so decorating is all it takes.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import functools
import inspect
import json
import re
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from .context import SyncToolContext, ToolCancelled, ToolContext

TaskSupport = Literal["forbidden", "optional", "required"]
JSON_SCHEMA_2020_12 = "https://json-schema.org/draft/2020-12/schema"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


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


@dataclass
class Tool:
    """A registered tool."""

    name: str
    fn: Callable[..., Any]
    description: str
    input_schema: dict[str, Any]
    title: str | None = None
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None
    task_support: TaskSupport = "forbidden"
    retryable: bool = False
    timeout_s: float | None = None
    max_concurrency: int | None = None
    immediate_response: str | None = None
    meta: dict[str, Any] | None = None
    args_model: type[BaseModel] | None = None
    ctx_param: str | None = None

    @property
    def is_async(self) -> bool:
        """Async tools run as asyncio tasks, sync ones in a thread pool."""
        return inspect.iscoroutinefunction(self.fn)

    def definition(self, *, with_execution: bool = True) -> dict[str, Any]:
        """The Tool object of ``tools/list``."""
        out: dict[str, Any] = {"name": self.name, "inputSchema": self.input_schema}
        if self.title:
            out["title"] = self.title
        if self.description:
            out["description"] = self.description
        if self.output_schema:
            out["outputSchema"] = self.output_schema
        if self.annotations:
            out["annotations"] = self.annotations
        if with_execution:
            out["execution"] = {"taskSupport": self.task_support}
        if self.meta:
            out["_meta"] = self.meta
        return out

    def validate_arguments(self, arguments: dict[str, Any] | None) -> dict[str, Any]:
        """Validate and coerce arguments; raises :class:`ToolInputError`."""
        arguments = arguments or {}
        if self.args_model is None:
            return dict(arguments)
        try:
            model = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            raise ToolInputError(f"Invalid arguments for tool {self.name}: {problems}") from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def invoke(
        self, arguments: dict[str, Any], ctx: ToolContext, *, executor: Executor | None = None
    ) -> dict[str, Any]:
        """Run the tool (async directly, sync in ``executor``'s threads) and build a CallToolResult.

        The worker passes an executor of its own for sync tools, sized from its concurrency, so
        tool code never shares threads with lease renewal or heartbeats.
        """
        kwargs = dict(arguments)
        if self.is_async:
            if self.ctx_param:
                kwargs[self.ctx_param] = ctx
            value = await self.fn(**kwargs)
        else:
            if self.ctx_param:
                kwargs[self.ctx_param] = SyncToolContext(ctx, asyncio.get_running_loop())
            if executor is None:
                value = await asyncio.to_thread(self.fn, **kwargs)
            else:
                call = contextvars.copy_context().run
                value = await asyncio.get_running_loop().run_in_executor(
                    executor, functools.partial(call, self.fn, **kwargs)
                )
        return to_call_tool_result(value, self.output_schema is not None)


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


class _ArgsBase(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _is_context(annotation: Any) -> bool:
    """Whether a parameter annotation names the tool context (also through Optional/unions)."""
    if annotation in (ToolContext, SyncToolContext):
        return True
    return any(arg in (ToolContext, SyncToolContext) for arg in get_args(annotation))


def _return_model(fn: Callable[..., Any]) -> type[BaseModel] | None:
    """The pydantic model a tool's return annotation names, if any (its output schema)."""
    try:
        annotation = get_type_hints(fn).get("return")
    except Exception:  # unresolvable forward references: no derived schema
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _schema_from_signature(
    fn: Callable[..., Any],
) -> tuple[type[BaseModel] | None, dict[str, Any], str | None]:
    sig = inspect.signature(fn)
    # include_extras: keep `Annotated[..., Field(...)]` constraints (bounds, lengths) of the arguments.
    hints = get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    ctx_param = None
    for name, param in sig.parameters.items():
        annotation = hints.get(name, Any)
        if _is_context(annotation) or name == "ctx":
            ctx_param = name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (annotation, default)
    model = create_model(f"{fn.__name__}_arguments", __base__=_ArgsBase, **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("properties", {})
    schema["type"] = "object"
    return model, schema, ctx_param


#: A decorated function keeps its own type.
F = TypeVar("F", bound=Callable[..., Any])


class Registry:
    """Tools, resources, templates and prompts known to this process."""

    def __init__(self) -> None:
        self.tools: dict[str, Tool] = {}
        self.resources: dict[str, Resource] = {}
        self.templates: dict[str, ResourceTemplate] = {}
        self.prompts: dict[str, Prompt] = {}

    # -- tools ---------------------------------------------------------------
    def tool(
        self,
        name: str | None = None,
        *,
        title: str | None = None,
        description: str | None = None,
        input_schema: dict[str, Any] | None = None,
        input_model: type[BaseModel] | None = None,
        output_schema: dict[str, Any] | type[BaseModel] | None = None,
        annotations: dict[str, Any] | None = None,
        task_support: TaskSupport = "forbidden",
        retryable: bool = False,
        timeout_s: float | None = None,
        max_concurrency: int | None = None,
        immediate_response: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Callable[[F], F]:
        """Register a function as an MCP tool: ``@tool()`` or ``@tool("name", ...)``.

        The input schema is derived from the type hints (or ``input_model``, or given verbatim
        as ``input_schema``); the output schema from a pydantic return annotation unless
        ``output_schema`` is given. A parameter typed :class:`ToolContext` (also
        ``ToolContext | None``) or named ``ctx`` receives the context. ``task_support`` is the
        tool's ``execution.taskSupport``. The decorated function is returned unchanged.
        """
        if callable(name):
            # Bare ``@tool`` would register nothing and replace the function with the decorator.
            raise TypeError("use @tool() (with parentheses), not bare @tool")
        if task_support not in ("forbidden", "optional", "required"):
            raise ValueError(f"task_support must be forbidden, optional or required, not {task_support!r}")

        def deco(fn: F) -> F:
            tool_name = name or fn.__name__
            if not _NAME_RE.match(tool_name):
                raise ValueError(f"invalid tool name {tool_name!r}")
            args_model: type[BaseModel] | None
            model, schema, ctx_param = _schema_from_signature(fn)
            args_model = model
            if input_model is not None:
                args_model = input_model
                schema = input_model.model_json_schema()
                schema.pop("title", None)
                schema["type"] = "object"
            if input_schema is not None:
                schema = input_schema
                args_model = None
            out_schema = output_schema if output_schema is not None else _return_model(fn)
            if isinstance(out_schema, type) and issubclass(out_schema, BaseModel):
                out_schema = out_schema.model_json_schema()
            self.tools[tool_name] = Tool(
                name=tool_name,
                fn=fn,
                description=description if description is not None else inspect.getdoc(fn) or "",
                input_schema=schema,
                title=title,
                output_schema=out_schema,
                annotations=annotations,
                task_support=task_support,
                retryable=retryable,
                timeout_s=timeout_s,
                max_concurrency=max_concurrency,
                immediate_response=immediate_response,
                meta=meta,
                args_model=args_model,
                ctx_param=ctx_param,
            )
            return fn

        return deco

    def get_tool(self, name: str) -> Tool | None:
        """A tool by name."""
        return self.tools.get(name)

    def sorted_tools(self) -> list[Tool]:
        """Tools in a deterministic (name) order, for stable pagination."""
        return [self.tools[k] for k in sorted(self.tools)]

    # -- resources -----------------------------------------------------------
    def resource(
        self,
        uri: str,
        *,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        mime_type: str | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a static resource; the function returns ``str`` (text) or ``bytes`` (blob)."""

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.resources[uri] = Resource(uri, name or fn.__name__, fn, title, description, mime_type)
            return fn

        return deco

    def resource_template(
        self,
        uri_template: str,
        *,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        mime_type: str | None = None,
        complete: dict[str, Callable[[str], list[str]]] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register an RFC 6570 level-1 template; variables become keyword arguments."""

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.templates[uri_template] = ResourceTemplate(
                uri_template, name or fn.__name__, fn, title, description, mime_type, complete or {}
            )
            return fn

        return deco

    # -- prompts -------------------------------------------------------------
    def prompt(
        self,
        name: str | None = None,
        *,
        title: str | None = None,
        description: str | None = None,
        arguments: list[dict[str, Any]] | None = None,
        complete: dict[str, Callable[[str], list[str]]] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a prompt; the function returns a list of PromptMessage dicts or a str."""

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            prompt_name = name or fn.__name__
            args = arguments
            if args is None:
                args = []
                for pname, param in inspect.signature(fn).parameters.items():
                    args.append({"name": pname, "required": param.default is inspect.Parameter.empty})
            self.prompts[prompt_name] = Prompt(
                prompt_name, fn, title, description or inspect.getdoc(fn) or "", args, complete or {}
            )
            return fn

        return deco


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


#: The process-wide registry that ``tools.py`` modules decorate into.
registry = Registry()
tool = registry.tool
resource = registry.resource
resource_template = registry.resource_template
prompt = registry.prompt

__all__ = [
    "Registry",
    "SyncToolContext",
    "Tool",
    "ToolCancelled",
    "ToolContext",
    "ToolInputError",
    "ToolResult",
    "audio",
    "image",
    "prompt",
    "registry",
    "resource",
    "resource_template",
    "text",
    "tool",
]
