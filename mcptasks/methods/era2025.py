"""MCP method handlers: the dispatch table of this server.

Each handler receives a :class:`RequestContext` and validated params, talks to the task engine and
selectors (in a thread, they use the ORM) and returns the result dict, or a
:class:`StreamReply` when the answer will arrive later on an SSE stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from asgiref.sync import sync_to_async

from mcptasks import conf, observability
from mcptasks.audit import watch
from mcptasks.db import write_pool as dbwrites
from mcptasks.methods import pagination
from mcptasks.models import McpSession, Task
from mcptasks.protocol import versions
from mcptasks.protocol.dispatch import Dispatcher
from mcptasks.protocol.errors import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    RESOURCE_NOT_FOUND,
    McpError,
    invalid_params,
)
from mcptasks.protocol.messages import (
    MODEL_IMMEDIATE_RESPONSE,
    CallToolParams,
    CompleteParams,
    EmptyParams,
    GetPromptParams,
    InitializeParams,
    PaginatedParams,
    ReadResourceParams,
    SetLevelParams,
    TaskIdParams,
)
from mcptasks.streams import events
from mcptasks.tasks import auditing, creation, idempotency, selectors, sessions, transitions, wire
from mcptasks.tools.registry import Registry, ToolInputError, registry
from tenants.auth import AuthContext

SERVER_NAME = "mcptasks"
SERVER_VERSION = "0.1.0"
INSTRUCTIONS = (
    "mcptasks hosts tools that can run as durable MCP tasks. Tools whose execution.taskSupport is "
    "'optional' or 'required' may be called with a `task` parameter; poll tasks/get at the returned "
    "pollInterval and fetch the outcome with tasks/result."
)


class OpenStream(Protocol):
    """How a handler opens its request's SSE stream (the HTTP layer provides it)."""

    async def __call__(self, prefix: str, *,
                       before_priming: Callable[[str], Awaitable[None]] | None = None) -> str: ...


@dataclass
class StreamReply:
    """The handler's answer will come on an SSE stream (plain tools/call or blocking tasks/result)."""

    stream_id: str
    task: Task
    mode: str  # "request" | "task_result"


@dataclass
class RequestContext:
    """Everything a handler may need about the request being served."""

    auth: AuthContext
    session: McpSession | None
    protocol_version: str
    request_id: str | int
    #: Open this request's SSE stream (``prefix``) and return its id; ``before_priming(stream_id)``
    #: runs before the priming event is sent, so an id the client holds is always resumable.
    open_stream: OpenStream
    registry: Registry = field(default_factory=lambda: registry)
    new_session: McpSession | None = None
    #: The task the request names, read with its session (see selectors.aget_session_and_task).
    prefetched: selectors.SessionAndTask | None = None


#: OAuth scopes of the method table.
TOOLS, TASKS = "mcp:tools", "mcp:tasks"

#: What the transport's error table answers (a tenant's refusals, a database outage: 503 +
#: Retry-After) is passed through to it rather than turned into a handler crash.
dispatcher: Dispatcher[RequestContext] = Dispatcher()


def _session(ctx: RequestContext) -> McpSession:
    if ctx.session is None:  # the consumer guarantees this; defensive
        raise McpError(INVALID_REQUEST, "Invalid Request: no session")
    return ctx.session


def server_capabilities(*, protocol_version: str, anonymous: bool) -> dict[str, Any]:
    """What this server declares to a client of ``protocol_version``."""
    caps: dict[str, Any] = {
        "tools": {"listChanged": False},
        "resources": {"subscribe": True, "listChanged": False},
        "prompts": {"listChanged": False},
        "logging": {},
        "completions": {},
    }
    if versions.has_tasks(protocol_version):
        tasks: dict[str, Any] = {"cancel": {}, "requests": {"tools": {"call": {}}}}
        if not anonymous:
            # Without an identity, listing would expose every task to anyone (spec, Security).
            tasks["list"] = {}
        caps["tasks"] = tasks
    return caps


@dispatcher.register("initialize", InitializeParams, before_init=True)
async def initialize(ctx: RequestContext, params: InitializeParams) -> dict[str, Any]:
    """Open a session and negotiate the protocol revision."""
    version = versions.negotiate(params.protocolVersion)
    ctx.new_session = await dbwrites.run(
        sessions.open_session,
        auth=ctx.auth,
        protocol_version=version,
        client_info=params.clientInfo.model_dump(mode="json", exclude_none=True),
        capabilities=params.capabilities,
    )
    return {
        "protocolVersion": version,
        "capabilities": server_capabilities(protocol_version=version, anonymous=ctx.auth.anonymous),
        "serverInfo": {"name": SERVER_NAME, "title": "mcptasks", "version": SERVER_VERSION},
        "instructions": INSTRUCTIONS,
    }


@dispatcher.register("ping", EmptyParams, before_init=True)
async def ping(ctx: RequestContext, params: EmptyParams) -> dict[str, Any]:
    """Liveness."""
    return {}


# --- tools -----------------------------------------------------------------------------------


@dispatcher.register("tools/list", PaginatedParams, scope=TOOLS)
async def tools_list(ctx: RequestContext, params: PaginatedParams) -> dict[str, Any]:
    """Tools in name order, paginated."""
    with_execution = versions.has_tasks(ctx.protocol_version)
    tools = [t.definition(with_execution=with_execution) for t in ctx.registry.sorted_tools()]
    return pagination.list_result("tools", tools, params.cursor, conf.get().TOOLS_PAGE_SIZE)


@dispatcher.register("tools/call", CallToolParams, scope=TOOLS, task_scope=TASKS, task_rate="create")
async def tools_call(ctx: RequestContext, params: CallToolParams) -> dict[str, Any] | StreamReply:
    """Run a tool: as a task when ``task`` is given (and supported), else as a plain request."""
    tool = ctx.registry.get_tool(params.name)
    if tool is None:
        raise invalid_params(f"Unknown tool: {params.name}")
    session = _session(ctx)
    as_task = params.task is not None and versions.has_tasks(ctx.protocol_version)
    if as_task and tool.task_support == "forbidden":
        raise McpError(METHOD_NOT_FOUND, f"Tool {tool.name} does not support task-augmented execution")
    if not as_task and tool.task_support == "required" and versions.has_tasks(ctx.protocol_version):
        raise McpError(METHOD_NOT_FOUND, f"Tool {tool.name} requires task-augmented execution")
    try:
        arguments = tool.validate_arguments(params.arguments)
    except ToolInputError as exc:
        if as_task:
            raise McpError(INVALID_PARAMS, str(exc)) from None
        return {"content": [{"type": "text", "text": str(exc)}], "isError": True}
    raw_arguments = params.arguments or {}
    if as_task:
        assert params.task is not None
        task = await creation.acreate_task(
            auth=ctx.auth,
            session=session,
            tool=tool,
            arguments=raw_arguments,
            request_id=ctx.request_id,
            progress_token=params.progress_token,
            requested_ttl_ms=params.task.ttl,
            # A retry (same key, or same session and request id) gets the first attempt's task.
            idempotency_key=idempotency.from_request(
                meta=params.meta, session_id=session.pk, request_id=ctx.request_id
            ),
        )
        result: dict[str, Any] = {"task": task.wire()}
        if tool.immediate_response:
            result["_meta"] = {MODEL_IMMEDIATE_RESPONSE: tool.immediate_response}
        return result
    del arguments  # validated; the worker re-validates from the stored raw arguments
    stream_id = await ctx.open_stream("p")
    # On the shared database thread, not a write thread: the priming event is out before the row
    # commits, and a notifications/cancelled sent on seeing it (that thread too) must find the row.
    task = await sync_to_async(creation.create_task)(
        auth=ctx.auth,
        session=session,
        tool=tool,
        arguments=raw_arguments,
        request_id=ctx.request_id,
        progress_token=params.progress_token,
        kind=Task.Kind.REQUEST,
        stream_id=stream_id,
    )
    return StreamReply(stream_id=stream_id, task=task, mode="request")


# --- tasks -----------------------------------------------------------------------------------


async def _lookup(ctx: RequestContext, task_id: str, method: str, *, status_only: bool = False) -> Task:
    """The caller's task; failed lookups are audited (the spec asks receivers to watch for them)."""
    hit = ctx.prefetched
    try:
        if hit is not None and hit.task_id == task_id and (status_only or not hit.status_only):
            return selectors.visible_task(hit.task)
        return await selectors.aget_task(auth=ctx.auth, task_id=task_id, status_only=status_only)
    except McpError as exc:
        await watch.alookup_failed(auth=ctx.auth, method=method, task_id=task_id, error=exc.message)
        raise


@dispatcher.register("tasks/get", TaskIdParams, scope=TASKS, rate="read", poll=True)
async def tasks_get(ctx: RequestContext, params: TaskIdParams) -> dict[str, Any]:
    """The task's current state."""
    task = await _lookup(ctx, params.taskId, "tasks/get", status_only=True)
    return task.wire()


@dispatcher.register("tasks/result", TaskIdParams, scope=TASKS, rate="read")
async def tasks_result(ctx: RequestContext, params: TaskIdParams) -> dict[str, Any] | StreamReply:
    """The outcome of a terminal task now; otherwise stream until it is terminal."""
    task = await _lookup(ctx, params.taskId, "tasks/result")
    if observability.tracing.TRACING:
        # Marks the retrieval in the task's own trace (linked to this request's).
        with observability.task_span(task, "mcptasks.task.result", link_current=True,
                                     **{"mcptasks.status": task.status, "mcptasks.tenant": ctx.auth.tenant_slug}):
            pass
    if task.is_terminal:
        await auditing.arecord_task_retrieval(auth=ctx.auth, task=task)
        result, error = wire.task_result_payload(task=task)
        if error is not None:
            raise McpError.from_error(error)
        assert result is not None
        return result

    async def bind(stream_id: str) -> None:
        # Which task and request id this stream answers, stored before the client can see the
        # stream's first event id: a client that drops and resumes it at once, through any
        # process, still gets the result.
        await sync_to_async(events.bind_stream)(session_id=task.session_id, stream_id=stream_id,
                                                task_id=task.task_id, rpc_id=ctx.request_id)

    stream_id = await ctx.open_stream("r", before_priming=bind)
    return StreamReply(stream_id=stream_id, task=task, mode="task_result")


@dispatcher.register("tasks/list", PaginatedParams, scope=TASKS, rate="read")
async def tasks_list(ctx: RequestContext, params: PaginatedParams) -> dict[str, Any]:
    """The caller's tasks, newest first."""
    if ctx.auth.anonymous:
        raise McpError(METHOD_NOT_FOUND, "tasks/list is not offered to anonymous callers")
    page = await selectors.alist_tasks(auth=ctx.auth, cursor=params.cursor, page_size=conf.get().TASK_LIST_PAGE_SIZE)
    out: dict[str, Any] = {"tasks": [t.wire() for t in page.tasks]}
    if page.next_cursor:
        out["nextCursor"] = page.next_cursor
    return out


@dispatcher.register("tasks/cancel", TaskIdParams, scope=TASKS)
async def tasks_cancel(ctx: RequestContext, params: TaskIdParams) -> dict[str, Any]:
    """Cancel a non-terminal task."""
    await _lookup(ctx, params.taskId, "tasks/cancel")
    task = await dbwrites.run(transitions.cancel_task, auth=ctx.auth, task_id=params.taskId)
    return task.wire()


# --- resources -------------------------------------------------------------------------------


async def _subscribe(ctx: RequestContext, uri: str, *, subscribed: bool) -> dict[str, Any]:
    await sync_to_async(sessions.set_subscription)(session=_session(ctx), uri=uri, subscribed=subscribed)
    return {}


@dispatcher.register("resources/list", PaginatedParams)
async def resources_list(ctx: RequestContext, params: PaginatedParams) -> dict[str, Any]:
    """Static resources."""
    return pagination.listing("resources", ctx.registry.resources, params.cursor)


@dispatcher.register("resources/templates/list", PaginatedParams)
async def resource_templates_list(ctx: RequestContext, params: PaginatedParams) -> dict[str, Any]:
    """Resource templates."""
    return pagination.listing("resourceTemplates", ctx.registry.templates, params.cursor)


@dispatcher.register("resources/read", ReadResourceParams)
async def resources_read(ctx: RequestContext, params: ReadResourceParams) -> dict[str, Any]:
    """Read a static resource or one matching a template."""
    res = ctx.registry.resources.get(params.uri)
    if res is not None:
        return {"contents": await res.read(params.uri)}
    for template in ctx.registry.templates.values():
        variables = template.match(params.uri)
        if variables is not None:
            return {"contents": await template.read(params.uri, variables)}
    raise McpError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": params.uri})


@dispatcher.register("resources/subscribe", ReadResourceParams)
async def resources_subscribe(ctx: RequestContext, params: ReadResourceParams) -> dict[str, Any]:
    """Remember the subscription (resources here do not change, so no update is ever sent)."""
    return await _subscribe(ctx, params.uri, subscribed=True)


@dispatcher.register("resources/unsubscribe", ReadResourceParams)
async def resources_unsubscribe(ctx: RequestContext, params: ReadResourceParams) -> dict[str, Any]:
    """Forget the subscription."""
    return await _subscribe(ctx, params.uri, subscribed=False)


# --- prompts and completion ------------------------------------------------------------------


@dispatcher.register("prompts/list", PaginatedParams)
async def prompts_list(ctx: RequestContext, params: PaginatedParams) -> dict[str, Any]:
    """Prompts in name order."""
    return pagination.listing("prompts", ctx.registry.prompts, params.cursor)


@dispatcher.register("prompts/get", GetPromptParams)
async def prompts_get(ctx: RequestContext, params: GetPromptParams) -> dict[str, Any]:
    """Render a prompt."""
    prompt = ctx.registry.prompts.get(params.name)
    if prompt is None:
        raise invalid_params(f"Unknown prompt: {params.name}")
    args = params.arguments or {}
    missing = [a["name"] for a in prompt.arguments if a.get("required") and a["name"] not in args]
    if missing:
        raise invalid_params(f"Missing required arguments: {', '.join(missing)}")
    known = {a["name"] for a in prompt.arguments}
    unknown = sorted(set(args) - known)
    if unknown:
        raise invalid_params(f"Unknown arguments: {', '.join(unknown)}")
    return await prompt.render(args)


@dispatcher.register("completion/complete", CompleteParams)
async def completion_complete(ctx: RequestContext, params: CompleteParams) -> dict[str, Any]:
    """Argument completion for prompts and resource templates."""
    completer = None
    if params.ref.type == "ref/prompt":
        prompt = ctx.registry.prompts.get(params.ref.name or "")
        if prompt is None:
            raise invalid_params(f"Unknown prompt: {params.ref.name}")
        completer = prompt.complete.get(params.argument.name)
    else:
        template = ctx.registry.templates.get(params.ref.uri or "")
        if template is None:
            raise invalid_params(f"Unknown resource template: {params.ref.uri}")
        completer = template.complete.get(params.argument.name)
    values = completer(params.argument.value) if completer else []
    return {"completion": {"values": values[:100], "total": len(values), "hasMore": len(values) > 100}}


@dispatcher.register("logging/setLevel", SetLevelParams)
async def logging_set_level(ctx: RequestContext, params: SetLevelParams) -> dict[str, Any]:
    """Set the minimum level of ``notifications/message`` for this session."""
    await sync_to_async(sessions.set_log_level)(session=_session(ctx), level=params.level)
    return {}


# --- the table's admission rules, by method (what mcptasks.endpoint.admission applies) -------


def required_scope(method: str, params: dict[str, Any] | None) -> str | None:
    """The OAuth scope a request needs, as its route declares (None: any valid token)."""
    route = dispatcher.route(method)
    return route.admission_rules(None, params)[0] if route is not None else None


def operation_class(method: str, params: dict[str, Any] | None) -> str:
    """Rate-limit class of a request (``create``, ``read`` or ``other``), as its route declares."""
    route = dispatcher.route(method)
    return route.admission_rules(None, params)[1] if route is not None else "other"


__all__ = ["INVALID_PARAMS", "StreamReply", "dispatcher"]
