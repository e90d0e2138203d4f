"""Reads and writes of the 2026-07-28 era over the shared task store.

Keyword-only and given the caller's auth context, like the rest of :mod:`mcptasks.tasks`, which
does the actual state changes: this module only adds what a stateless client needs (a session
row standing for one request, answering input requests by key, waiting for a run to need input
or end). The era's wire forms are in :mod:`mcptasks.tasks.wire`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from mcptasks.models import TERMINAL, McpSession, StreamEvent, Task
from mcptasks.protocol.era2026 import VERSION, RequestMeta
from mcptasks.protocol.errors import INVALID_PARAMS, TASK_NOT_FOUND, McpError
from mcptasks.streams import events
from mcptasks.tasks import creation, messages, selectors, sessions, wire
from mcptasks.tools.registry import Tool
from tenants.auth import AuthContext

# --- sessions standing for one stateless request ---------------------------------------------


def open_request_session(*, auth: AuthContext, meta: RequestMeta) -> McpSession:
    """The session row of one 2026-07-28 ``tools/call``.

    It is what the engine already reads: the worker takes the client's capabilities for
    ``ctx.client_supports`` from it, and the run's events are stored under it. Nobody resumes
    it; the idle-session cleanup removes it like any other.
    """
    info = meta.client_info.model_dump(mode="json", exclude_none=True) if meta.client_info else {}
    # Every tools/call stores these: bounded like an initialize's (-32602 past the limit).
    sessions.check_client_metadata(client_info=info, capabilities=meta.client_capabilities)
    return McpSession.objects.create(
        tenant_id=auth.tenant_id, principal_id=auth.principal_id, protocol_version=VERSION,
        client_info=info, client_capabilities=dict(meta.client_capabilities), initialized=True,
    )


#: How long a plain 2026-07-28 run may wait for its client's next round. Past it the run
#: fails (its pending request can no longer be answered) and frees its quota slot; its
#: ``requestState`` stops verifying at the same time.
PLAIN_RUN_TTL_S = 600


def start_plain_run(*, auth: AuthContext, session: McpSession, tool: Tool, arguments: dict[str, Any],
                    request_id: str | int, progress_token: str | int | None = None) -> Task:
    """Create the run of a plain ``tools/call`` with its round deadline (one transaction).

    The deadline is written before the commit that wakes a worker, so the run never starts
    without it.
    """
    with transaction.atomic():
        task = creation.create_task(
            auth=auth, session=session, tool=tool, arguments=arguments, request_id=request_id,
            progress_token=progress_token, kind=Task.Kind.REQUEST, stream_id=events.new_stream_id("p"),
        )
        task.expires_at = timezone.now() + dt.timedelta(seconds=PLAIN_RUN_TTL_S)
        Task.objects.filter(pk=task.pk).update(expires_at=task.expires_at)
    return task


# --- input requests ---------------------------------------------------------------------------


def answer_inputs(*, auth: AuthContext, task: Task, responses: dict[str, dict[str, Any]]) -> int:
    """Answer the task's pending requests whose keys ``responses`` names; returns how many.

    Unknown, already answered or superseded keys are ignored, and a partial set is fine: the
    rest stay outstanding. Each answer goes through ``messages.answer_task_message``, the path
    a 2025-11-25 client's JSON-RPC response takes, so the tool cannot tell the eras apart.
    """
    answered = 0
    for msg in selectors.pending_input(task_ids=[task.pk]):
        key = wire.input_key(msg)
        if key not in responses:
            continue
        response = {"jsonrpc": "2.0", "id": msg.rpc_id, "result": responses[key]}
        if messages.answer_task_message(auth=auth, rpc_id=msg.rpc_id, response=response):
            answered += 1
    return answered


# --- waiting for a plain run ------------------------------------------------------------------


def _round_state(pk: int) -> tuple[str, int] | None:
    status = Task.objects.filter(pk=pk).values_list("status", flat=True).first()
    if status is None:
        return None
    return status, selectors.pending_input(task_ids=[pk]).count()


#: A tool that asks several things at once (``asyncio.gather``) stores them one after the
#: other: a round is answered once the pending count held still this long.
SETTLE_S = 0.06


def progress_since(*, task: Task, after: int) -> tuple[list[dict[str, Any]], int]:
    """The run's ``notifications/progress`` stored after sequence ``after``, and the new position.

    Only progress is forwarded: a stateless response stream carries no server requests, and
    log messages only when asked for (not offered here).
    """
    rows = list(StreamEvent.objects.filter(stream_id=task.stream_id or "", seq__gt=after)
                .order_by("seq").values_list("seq", "data")[:200])
    notes = []
    for _seq, data in rows:
        message = json.loads(data)
        if isinstance(message, dict) and message.get("method") == "notifications/progress":
            notes.append(message)
    return notes, (rows[-1][0] if rows else after)


async def wait_for_round(
    *, task: Task, timeout_s: float, on_tick: Callable[[], Awaitable[None]] | None = None
) -> Task | None:
    """Wait until the run ended or asks for input; the refreshed task, or None on timeout.

    A stateless request has no stream to be woken on, so this re-reads the row with a short,
    growing interval (20 ms up to 250 ms).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    delay = 0.02
    seen = -1
    while True:
        if on_tick is not None:
            await on_tick()
        state = await sync_to_async(_round_state)(task.pk)
        if state is None:
            raise McpError(INVALID_PARAMS, TASK_NOT_FOUND)
        status, waiting = state
        if status in TERMINAL or (waiting and waiting == seen):
            return await sync_to_async(Task.objects.get)(pk=task.pk)
        if loop.time() >= deadline:
            return None
        if waiting:
            seen = waiting
            await asyncio.sleep(SETTLE_S)
            continue
        await asyncio.sleep(delay)
        delay = min(0.25, delay * 1.5)


# --- tasks/get --------------------------------------------------------------------------------


