"""The 2026-07-28 method table: stateless requests and the ``io.modelcontextprotocol/tasks`` extension.

Handlers get an :class:`~mcptasks.methods.era2026_context.EraContext` (the caller, the validated
per-request ``_meta``) and validated params, and return the result to send; they never write
responses. The rounds of a plain ``tools/call`` are in :mod:`.era2026_rounds`, the rendering of a
task that ``tasks/get`` shares with listens and webhooks in :mod:`.views`. Methods whose
behaviour did not change (resources, prompts, completion) call the 2025-11-25 handlers and add
``resultType`` and the cache hints. Tasks are read and written through the same store,
task engine and audit as the 2025-11-25 methods, so a task is one task whichever era looks at it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from pydantic import Field

from mcptasks import conf
from mcptasks.audit import watch
from mcptasks.methods import era2025 as legacy
from mcptasks.methods import era2026_rounds as rounds
from mcptasks.methods import inputs, pagination
from mcptasks.methods import listen as listen_mod
from mcptasks.methods import request_state as state
from mcptasks.methods.era2026_context import TASKS_REQUIRED, EraContext, missing_capability
from mcptasks.methods.era2026_rounds import PlainRound
from mcptasks.methods.implementation import server_info
from mcptasks.models import Task
from mcptasks.protocol import era2026, versions
from mcptasks.protocol.dispatch import Dispatcher
from mcptasks.protocol.era2026 import (
    TASKS_EXTENSION,
    CallToolParams,
    ListenParams,
    TaskIdParams,
    TasksUpdateParams,
)
from mcptasks.protocol.errors import RESOURCE_NOT_FOUND, McpError, invalid_params
from mcptasks.protocol.messages import CompleteParams, EmptyParams, GetPromptParams, PaginatedParams, ReadResourceParams
from mcptasks.tasks import auditing, creation, era2026_view, idempotency, selectors, transitions, wire
from mcptasks.tasks import era2026 as tasks
from mcptasks.tasks.era2026_view import atasks_as_seen_by, task_as_seen_by
from mcptasks.tools.registry import ToolInputError

#: Every revision this endpoint serves: this era first, then the session-based ones.
SUPPORTED_VERSIONS: tuple[str, ...] = (era2026.VERSION, *versions.SUPPORTED)

#: Cache hints (SEP-2549). The lists are the same for every caller of a deployment but are
#: served behind authentication, so only the caller's own cache may keep them.
LIST_TTL_MS = 60_000
READ_TTL_MS = 0
CACHE_SCOPE = "private"

INSTRUCTIONS = (
    "mcptasks hosts tools that can run as durable tasks (extension io.modelcontextprotocol/tasks). "
    "Declare the extension in your per-request clientCapabilities and the server runs task-capable "
    "tools as tasks: poll tasks/get at pollIntervalMs and answer inputRequests with tasks/update."
)

dispatcher: Dispatcher[EraContext] = Dispatcher()


def server_capabilities() -> dict[str, Any]:
    """What this era advertises: the core capabilities and the tasks extension (no legacy ``tasks``)."""
    return {
        "tools": {"listChanged": False},
        "resources": {"subscribe": False, "listChanged": False},
        "prompts": {"listChanged": False},
        "completions": {},
        "extensions": {TASKS_EXTENSION: {}},
    }


def _cacheable(result: dict[str, Any], ttl_ms: int) -> dict[str, Any]:
    return era2026.complete({**result, "ttlMs": ttl_ms, "cacheScope": CACHE_SCOPE})


@dispatcher.register("server/discover", EmptyParams)
async def discover(ctx: EraContext, params: EmptyParams) -> dict[str, Any]:
    """Supported versions, capabilities and who we are."""
    return _cacheable({
        "supportedVersions": list(SUPPORTED_VERSIONS),
        "capabilities": server_capabilities(),
        "instructions": INSTRUCTIONS,
        "_meta": {era2026.META_SERVER_INFO: server_info()},
    }, LIST_TTL_MS)


# --- tools ----------------------------------------------------------------------------------


@dispatcher.register("tools/list", PaginatedParams, scope=legacy.TOOLS)
async def tools_list(ctx: EraContext, params: PaginatedParams) -> dict[str, Any]:
    """Tools in name order (deterministic), without the legacy ``execution`` member."""
    tools = [t.definition(with_execution=False) for t in ctx.registry.sorted_tools()]
    return _cacheable(pagination.list_result("tools", tools, params.cursor, conf.get().TOOLS_PAGE_SIZE), LIST_TTL_MS)


def creates_task(ctx: EraContext, tool_name: str) -> bool:
    """The server's decision (SEP-2663): a task for a task-capable tool, if the client can take one."""
    tool = ctx.registry.get_tool(tool_name)
    return tool is not None and tool.task_support != "forbidden" and ctx.meta.declares_tasks()


def _continues_task(ctx: EraContext, request_state: str, tool_name: str) -> bool:
    """Whether ``request_state`` is a valid state of the caller that continues a task (an invalid
    one is refused by the handler, -32602, as before)."""
    try:
        return state.verify(auth=ctx.auth, state=request_state, tool=tool_name).kind == "task"
    except McpError:
        return False


def _tools_call_rules(ctx: EraContext, params: Any) -> tuple[str | None, str] | None:
    """The admission rule of ``tools/call`` (the route's own, see ``Route.rules``): creating a task
    needs ``mcp:tasks`` and counts as ``create``; a retry whose ``requestState`` continues a task
    (gather-input-first) answers that task's input, so it needs what ``tasks/update`` needs."""
    if not isinstance(params, dict) or not isinstance(params.get("name"), str):
        return None
    request_state = params.get("requestState")
    if request_state is None and creates_task(ctx, params["name"]):
        return legacy.TASKS, "create"
    if isinstance(request_state, str) and _continues_task(ctx, request_state, params["name"]):
        update = dispatcher.route("tasks/update")
        assert update is not None
        return update.scope, update.rate
    return None


@dispatcher.register("tools/call", CallToolParams, scope=legacy.TOOLS, rules=_tools_call_rules)
async def tools_call(ctx: EraContext, params: CallToolParams) -> dict[str, Any] | PlainRound:
    """Run a tool: as a task when the server decides so, else as rounds of a plain request."""
    tool = ctx.registry.get_tool(params.name)
    if tool is None:
        raise invalid_params(f"Unknown tool: {params.name}")
    if params.requestState is not None:
        return await rounds.next_round(ctx, params)
    as_task = creates_task(ctx, tool.name)
    if tool.task_support == "required" and not as_task:
        raise missing_capability(TASKS_REQUIRED, f"tool {tool.name} runs only as a task ({TASKS_EXTENSION})")
    try:
        tool.validate_arguments(params.arguments)
    except ToolInputError as exc:
        if as_task:
            raise invalid_params(str(exc)) from None
        return era2026.complete({"content": [{"type": "text", "text": str(exc)}], "isError": True})
    session = await sync_to_async(tasks.open_request_session)(auth=ctx.auth, meta=ctx.meta)
    if as_task:
        task = await creation.acreate_task(
            auth=ctx.auth, session=session, tool=tool, arguments=params.arguments or {},
            request_id=ctx.request_id, progress_token=None,
            # Requests carry no session here: only a client's key makes a retry idempotent.
            idempotency_key=idempotency.from_request(meta=params.meta, session_id=None, request_id=None),
        )
        if rounds.gathers_input_first(tool.meta):
            # SEP-2663 composition: the input the tool asks for first is gathered in plain
            # rounds; the retry that answers it gets the CreateTaskResult.
            done = await tasks.wait_for_round(task=task, timeout_s=rounds.GATHER_WAIT_S)
            if done is not None and not done.is_terminal:
                requests = await sync_to_async(era2026_view.pending_requests)(task=done)
                if requests:
                    issued = state.issue(auth=ctx.auth, task_id=task.task_id, tool=tool.name, round_=1, kind="task")
                    return era2026.input_required(requests, issued)
            task = done or task
        # Created and committed: an immediate tasks/get finds it.
        return {"resultType": era2026.TASK, **wire.task_object(task)}
    token = rounds.progress_token(params.meta)
    task = await sync_to_async(tasks.start_plain_run)(
        auth=ctx.auth, session=session, tool=tool, arguments=params.arguments or {}, request_id=ctx.request_id,
        progress_token=token,
    )
    given = dict(params.inputResponses or {})
    if token is not None:
        # The transport streams the run's progress, then this round's outcome (see PlainRound).
        return rounds.PlainRound(ctx=ctx, task=task, tool_name=tool.name, round_=1, given=given)
    return await rounds.round_outcome(ctx, task, tool_name=tool.name, round_=1, given=given)


# --- tasks (the extension) --------------------------------------------------------------------


def _require_tasks(ctx: EraContext) -> None:
    if not ctx.meta.declares_tasks():
        raise missing_capability(TASKS_REQUIRED, TASKS_EXTENSION)


async def _lookup(ctx: EraContext, task_id: str, method: str) -> Task:
    """The caller's task (another tenant's or principal's is the same -32602 as a missing one)."""
    try:
        return await selectors.aget_task(auth=ctx.auth, task_id=task_id)
    except McpError as exc:
        await watch.alookup_failed(auth=ctx.auth, method=method, task_id=task_id, error=exc.message)
        raise


@dispatcher.register("tasks/get", TaskIdParams, scope=legacy.TASKS, rate="read", poll=True)
async def tasks_get(ctx: EraContext, params: TaskIdParams) -> dict[str, Any]:
    """The task with its ``inputRequests``, ``result`` or ``error``."""
    _require_tasks(ctx)
    task = await _lookup(ctx, params.taskId, "tasks/get")
    (detailed,) = await atasks_as_seen_by([task], principal_id=ctx.auth.principal_id)
    if "result" in detailed:
        await auditing.arecord_task_retrieval(auth=ctx.auth, task=task)
    return detailed


@dispatcher.register("tasks/update", TasksUpdateParams, scope=legacy.TASKS)
async def tasks_update(ctx: EraContext, params: TasksUpdateParams) -> dict[str, Any]:
    """Answer outstanding input requests by key (unknown or answered keys are ignored)."""
    _require_tasks(ctx)
    task = await _lookup(ctx, params.taskId, "tasks/update")
    if task.principal_id != ctx.auth.principal_id:
        # A tenant-wide reader may watch a task but never answer its owner's requests.
        return era2026.complete({})
    await sync_to_async(tasks.answer_inputs)(auth=ctx.auth, task=task, responses=params.inputResponses)
    return era2026.complete({})


@dispatcher.register("tasks/cancel", TaskIdParams, scope=legacy.TASKS)
async def tasks_cancel(ctx: EraContext, params: TaskIdParams) -> dict[str, Any]:
    """Cancel; an already terminal task is acknowledged the same way (idempotent)."""
    _require_tasks(ctx)
    task = await _lookup(ctx, params.taskId, "tasks/cancel")
    if not task.is_terminal:
        # Ending while we cancel is the idempotent case, not an error.
        with contextlib.suppress(McpError):
            await sync_to_async(transitions.cancel_task)(auth=ctx.auth, task_id=params.taskId)
    return era2026.complete({})


# --- subscriptions/listen ---------------------------------------------------------------------


@dataclass
class ListenStream:
    """A listen the transport serves as an SSE stream (see :mod:`.listen`)."""

    listen: listen_mod.Listen


def _listen_rules(ctx: EraContext, params: Any) -> tuple[str | None, str] | None:
    """The admission rule of ``subscriptions/listen``: watching tasks needs what reading them needs."""
    wanted = params.get("notifications") if isinstance(params, dict) else None
    if isinstance(wanted, dict) and wanted.get("taskIds") is not None:
        return legacy.TASKS, "read"
    return None


@dispatcher.register("subscriptions/listen", ListenParams, scope=legacy.TOOLS, rate="read",
                     rules=_listen_rules)
async def subscriptions_listen(ctx: EraContext, params: ListenParams) -> ListenStream:
    """Open a listen: agree to the task ids the caller may watch (the only kind this server emits).

    List-changed and resource-update notifications are never emitted here (the capabilities say
    ``listChanged: false``, ``subscribe: false``), so they are left out of the acknowledgement.
    """
    wanted = params.notifications.taskIds
    agreed: dict[str, Any] = {}
    task_ids: list[str] = []
    if wanted is not None:
        _require_tasks(ctx)
        task_ids = await sync_to_async(listen_mod.listenable)(auth=ctx.auth, task_ids=wanted)
        agreed["taskIds"] = task_ids
    return ListenStream(listen_mod.Listen(auth=ctx.auth, request_id=ctx.request_id, agreed=agreed,
                                          task_ids=task_ids))


# --- resources, prompts, completion: unchanged but for resultType and cache hints -------------


@dispatcher.register("resources/list", PaginatedParams)
async def resources_list(ctx: EraContext, params: PaginatedParams) -> dict[str, Any]:
    """Static resources."""
    return _cacheable(await legacy.resources_list(ctx.legacy(), params), LIST_TTL_MS)


@dispatcher.register("resources/templates/list", PaginatedParams)
async def resource_templates_list(ctx: EraContext, params: PaginatedParams) -> dict[str, Any]:
    """Resource templates."""
    return _cacheable(await legacy.resource_templates_list(ctx.legacy(), params), LIST_TTL_MS)


@dispatcher.register("resources/read", ReadResourceParams)
async def resources_read(ctx: EraContext, params: ReadResourceParams) -> dict[str, Any]:
    """Read a resource; an unknown one is -32602 in this era (SEP-2164; 2025-11-25 used -32002)."""
    try:
        return _cacheable(await legacy.resources_read(ctx.legacy(), params), READ_TTL_MS)
    except McpError as exc:
        if exc.code == RESOURCE_NOT_FOUND:
            raise invalid_params("Resource not found", {"uri": params.uri}) from None
        raise


@dispatcher.register("prompts/list", PaginatedParams)
async def prompts_list(ctx: EraContext, params: PaginatedParams) -> dict[str, Any]:
    """Prompts in name order."""
    return _cacheable(await legacy.prompts_list(ctx.legacy(), params), LIST_TTL_MS)


class PromptParams(GetPromptParams):
    """``prompts/get`` with the input round members (SEP-2322)."""

    inputResponses: dict[str, dict[str, Any]] | None = Field(default=None, max_length=era2026.MAX_INPUT_RESPONSES)
    requestState: str | None = Field(default=None, max_length=4096)


@dispatcher.register("prompts/get", PromptParams)
async def prompts_get(ctx: EraContext, params: PromptParams) -> dict[str, Any]:
    """Render a prompt; a prompt that needs the client's input answers with input rounds."""
    subject = "prompt:" + params.name
    round_ = 1
    if params.requestState is not None:
        round_ = state.verify(auth=ctx.auth, state=params.requestState, tool=subject).round + 1
    token = inputs.provide(params.inputResponses)
    try:
        return era2026.complete(await legacy.prompts_get(ctx.legacy(), params))
    except inputs.NeedsInput as need:
        # Nothing runs between rounds: the state only binds the retry to this caller and prompt.
        issued = state.issue(auth=ctx.auth, task_id="", tool=subject, round_=round_)
        return era2026.input_required(need.requests, issued)
    finally:
        inputs.reset(token)


@dispatcher.register("completion/complete", CompleteParams)
async def completion_complete(ctx: EraContext, params: CompleteParams) -> dict[str, Any]:
    """Argument completion."""
    return era2026.complete(await legacy.completion_complete(ctx.legacy(), params))


__all__ = [
    "SUPPORTED_VERSIONS", "EraContext", "ListenParams", "ListenStream", "PlainRound", "dispatcher", "server_info",
    "task_as_seen_by",
]
