"""The rounds of a 2026-07-28 ``tools/call``: a plain run answered round by round
(``input_required`` with a ``requestState``, then the result), or the first input of a task
gathered in plain rounds before the task is handed over (SEP-2663).

The handler itself is registered in :mod:`mcptasks.methods.era2026`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async

from mcptasks.methods import request_state as state
from mcptasks.methods.era2026_context import EraContext
from mcptasks.models import Task
from mcptasks.protocol import era2026
from mcptasks.protocol.era2026 import CallToolParams
from mcptasks.protocol.errors import INTERNAL_ERROR, McpError
from mcptasks.tasks import era2026 as tasks
from mcptasks.tasks import era2026_view, selectors, wire

#: How long one plain ``tools/call`` round waits for its run before answering -32603.
ROUND_WAIT_S = 600.0

#: Tool ``_meta`` flag: gather the tool's first input in plain rounds, then hand over the task.
GATHER_INPUT_FIRST = "io.mcptasks/gatherInputFirst"
#: How long a creating call waits for such a tool's first question before answering with the task.
GATHER_WAIT_S = 5.0


def gathers_input_first(meta: dict[str, Any] | None) -> bool:
    """Whether a tool asked for the MRTR-then-task composition (SEP-2663)."""
    return bool((meta or {}).get(GATHER_INPUT_FIRST))


def progress_token(meta: dict[str, Any] | None) -> str | int | None:
    """The request's ``_meta.progressToken`` if it is a string or an integer."""
    token = (meta or {}).get("progressToken")
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


@dataclass
class PlainRound:
    """A round whose answer comes on an SSE response: the run's progress, then :meth:`outcome`."""

    ctx: EraContext
    task: Task
    tool_name: str
    round_: int
    given: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def outcome(self, on_tick: Callable[[], Awaitable[None]]) -> dict[str, Any]:
        """The round's result (or raise its error), calling ``on_tick`` while it waits."""
        return await round_outcome(self.ctx, self.task, tool_name=self.tool_name, round_=self.round_,
                                    on_tick=on_tick, given=self.given)


async def next_round(ctx: EraContext, params: CallToolParams) -> dict[str, Any]:
    """A retried ``tools/call`` (it carries ``requestState``): answer the run's pending requests,
    then report how it goes on."""
    assert params.requestState is not None
    round_state = state.verify(auth=ctx.auth, state=params.requestState, tool=params.name)
    kind = Task.Kind.TASK if round_state.kind == "task" else Task.Kind.REQUEST
    task = await sync_to_async(selectors.get_run)(auth=ctx.auth, task_id=round_state.task_id, kind=kind)
    if params.inputResponses:
        await sync_to_async(tasks.answer_inputs)(auth=ctx.auth, task=task, responses=params.inputResponses)
    if kind == Task.Kind.TASK:
        if await sync_to_async(era2026_view.pending_count)(task=task):
            # Still missing answers: ask again (same questions, a fresh state).
            requests = await sync_to_async(era2026_view.pending_requests)(task=task)
            token = state.issue(auth=ctx.auth, task_id=task.task_id, tool=params.name,
                                round_=round_state.round + 1, kind="task")
            return era2026.input_required(requests, token)
        await sync_to_async(task.refresh_from_db)()
        return {"resultType": era2026.TASK, **wire.task_object(task)}
    return await round_outcome(ctx, task, tool_name=params.name, round_=round_state.round + 1)


async def round_outcome(
    ctx: EraContext, task: Task, *, tool_name: str, round_: int,
    on_tick: Callable[[], Awaitable[None]] | None = None, given: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The outcome of one round of a plain run: its result, its error, or the input it asks for.

    Wait for the run; answers it asks for that the request already carries (``given``, e.g.
    ``inputResponses`` sent with the first call) are used at once, each key once."""
    unused = dict(given or {})
    while True:
        done = await tasks.wait_for_round(task=task, timeout_s=ROUND_WAIT_S, on_tick=on_tick)
        if done is None:
            raise McpError(INTERNAL_ERROR, f"The call did not finish or ask for input within {ROUND_WAIT_S:.0f} s")
        if done.is_terminal:
            break
        requests = await sync_to_async(era2026_view.pending_requests)(task=done)
        usable = {k: unused.pop(k) for k in list(requests) if k in unused}
        if usable:
            await sync_to_async(tasks.answer_inputs)(auth=ctx.auth, task=done, responses=usable)
            continue
        if requests:
            token = state.issue(auth=ctx.auth, task_id=done.task_id, tool=tool_name, round_=round_)
            return era2026.input_required(requests, token)
    if done.error is not None:
        raise era2026.era_error(McpError.from_error(done.error))
    if done.status == "cancelled":
        raise McpError(INTERNAL_ERROR, "The call was cancelled")
    return wire.call_result(done.result)
