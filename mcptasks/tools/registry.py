"""The tool-author API: register tools, resources and prompts with decorators.

Example::

    from mcptasks.tools.registry import tool, ToolContext

    @tool(title="Add", task_support="optional")
    async def add(a: int, b: int, ctx: ToolContext) -> str:
        await ctx.report_progress(1, 1)
        return str(a + b)

Modules named ``tools.py`` in installed apps are imported at startup (the way ``admin.py`` is),
so decorating is all it takes.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import re
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from mcptasks.tools.context import SyncToolContext, ToolCancelled, ToolContext
from mcptasks.tools.features import Prompt, Resource, ResourceTemplate
from mcptasks.tools.results import (
    ToolInputError,
    ToolResult,
    audio,
    image,
    text,
    to_call_tool_result,
)
from mcptasks.tools.signature import return_model, schema_from_signature

TaskSupport = Literal["forbidden", "optional", "required"]
JSON_SCHEMA_2020_12 = "https://json-schema.org/draft/2020-12/schema"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


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
            model, schema, ctx_param = schema_from_signature(fn)
            args_model = model
            if input_model is not None:
                args_model = input_model
                schema = input_model.model_json_schema()
                schema.pop("title", None)
                schema["type"] = "object"
            if input_schema is not None:
                schema = input_schema
                args_model = None
            out_schema = output_schema if output_schema is not None else return_model(fn)
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
