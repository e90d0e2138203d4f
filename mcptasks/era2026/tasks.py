"""Reads and writes of the 2026-07-28 era over the shared task store.

Keyword-only and given the caller's auth context, like :mod:`mcptasks.services` and
:mod:`mcptasks.selectors`, which do the actual state changes: this module only adds what a
stateless client needs (a session row standing for one request, answering input requests by
key, waiting for a run to need input or end) and the wire form of a task in this era.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from tenants.auth import AuthContext

from .. import bus, fastreads, limits, services
from ..context import INPUT_KEY_META
from ..models import TERMINAL, McpSession, StreamEvent, Task, TaskMessage, TaskStatus, _iso
from ..protocol.era2026 import INPUT_KEY_PATTERN, VERSION, RequestMeta, task_wire
from ..protocol.errors import INVALID_PARAMS, TASK_EXPIRED, TASK_NOT_FOUND, McpError
from ..protocol.messages import RELATED_TASK
from ..registry import Tool

_INPUT_KEY = re.compile(INPUT_KEY_PATTERN)


# --- sessions standing for one stateless request ---------------------------------------------


def open_request_session(*, auth: AuthContext, meta: RequestMeta) -> McpSession:
    """The session row of one 2026-07-28 ``tools/call``.

    It is what the engine already reads: the worker takes the client's capabilities for
    ``ctx.client_supports`` from it, and the run's events are stored under it. Nobody resumes
    it; the idle-session cleanup removes it like any other.
    """
    info = meta.client_info.model_dump(mode="json", exclude_none=True) if meta.client_info else {}
    # Every tools/call stores these: bounded like an initialize's (-32602 past the limit).
    limits.check_client_metadata(client_info=info, capabilities=meta.client_capabilities)
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
        task = services.create_task(
            auth=auth, session=session, tool=tool, arguments=arguments, request_id=request_id,
            progress_token=progress_token, kind=Task.Kind.REQUEST, stream_id=bus.new_stream_id("p"),
        )
        task.expires_at = timezone.now() + dt.timedelta(seconds=PLAIN_RUN_TTL_S)
        Task.objects.filter(pk=task.pk).update(expires_at=task.expires_at)
    return task


# --- lookups ----------------------------------------------------------------------------------


def get_run(*, auth: AuthContext, task_id: str, kind: str) -> Task:
    """The caller's own task or plain run, or -32602 (missing, someone else's, expired).

    Unlike ``selectors.get_task`` this also finds plain runs (``kind=request``), which only
    their principal ever continues, so it is always scoped to the principal.
    """
    task = Task.objects.filter(
        task_id=task_id, kind=kind, tenant_id=auth.tenant_id, principal_id=auth.principal_id
    ).first()
    if task is None:
        raise McpError(INVALID_PARAMS, TASK_NOT_FOUND)
    if task.expires_at is not None and task.expires_at <= timezone.now():
        raise McpError(INVALID_PARAMS, TASK_EXPIRED)
    return task


# --- input requests ---------------------------------------------------------------------------


def input_key(message: TaskMessage) -> str:
    """The key of a pending request in ``inputRequests``: the tool's key, else its rpc id."""
    meta = message.params.get("_meta") if isinstance(message.params, dict) else None
    key = meta.get(INPUT_KEY_META) if isinstance(meta, dict) else None
    return key if isinstance(key, str) and _INPUT_KEY.fullmatch(key) else message.rpc_id


def input_request(message: TaskMessage) -> dict[str, Any]:
    """``{method, params}`` of a pending request as the client sees it (internal meta removed)."""
    params = dict(message.params or {})
    meta = {k: v for k, v in (params.get("_meta") or {}).items() if k not in (INPUT_KEY_META, RELATED_TASK)}
    if meta:
        params["_meta"] = meta
    else:
        params.pop("_meta", None)
    return {"method": message.method, "params": params}


def pending_requests(*, task: Task) -> dict[str, dict[str, Any]]:
    """Every outstanding input request of ``task`` by key (oldest first)."""
    msgs = TaskMessage.objects.filter(task_id=task.pk, answered_at__isnull=True).order_by("id")
    return requests_by_key(msgs)


def requests_by_key(messages: Iterable[TaskMessage]) -> dict[str, dict[str, Any]]:
    """``inputRequests`` from one task's outstanding messages, given oldest first."""
    return {input_key(m): input_request(m) for m in messages}


async def apending_requests(*, tasks: list[Task]) -> dict[int, dict[str, dict[str, Any]]]:
    """:func:`pending_requests` of several tasks (by pk) from async code, in one query.

    On PostgreSQL through :mod:`mcptasks.fastreads` (no thread hop); otherwise, or while that
    path fails, through the ORM in a thread. Only committed rows are read on the fast path.
    """
    pks = [t.pk for t in tasks]
    if not pks:
        return {}
    msgs: list[TaskMessage] | None = None
    if fastreads.available():
        with contextlib.suppress(fastreads.Unavailable):
            msgs = await fastreads.fetch_many(
                TaskMessage, where=['"task_id" = ANY(%s)', '"answered_at" IS NULL'], params=[pks],
                order_by='"task_id", "id"', limit=_ALL_ROWS)
    if msgs is None:
        msgs = await sync_to_async(lambda: list(
            TaskMessage.objects.filter(task_id__in=pks, answered_at__isnull=True).order_by("task_id", "id")))()
    grouped: dict[int, list[TaskMessage]] = {pk: [] for pk in pks}
    for m in msgs:
        grouped[m.task_id].append(m)
    return {pk: requests_by_key(group) for pk, group in grouped.items()}


#: "Every row" for a fast read that needs a limit (a task's outstanding requests are few).
_ALL_ROWS = 2**31 - 1


def pending_count(*, task: Task) -> int:
    """How many of the task's requests wait for an answer (sync; call from a thread or a sync path)."""
    return TaskMessage.objects.filter(task_id=task.pk, answered_at__isnull=True).count()


def answer_inputs(*, auth: AuthContext, task: Task, responses: dict[str, dict[str, Any]]) -> int:
    """Answer the task's pending requests whose keys ``responses`` names; returns how many.

    Unknown, already answered or superseded keys are ignored, and a partial set is fine: the
    rest stay outstanding. Each answer goes through ``services.answer_task_message``, the path
    a 2025-11-25 client's JSON-RPC response takes, so the tool cannot tell the eras apart.
    """
    answered = 0
    for msg in TaskMessage.objects.filter(task_id=task.pk, answered_at__isnull=True).order_by("id"):
        key = input_key(msg)
        if key not in responses:
            continue
        response = {"jsonrpc": "2.0", "id": msg.rpc_id, "result": responses[key]}
        if services.answer_task_message(auth=auth, rpc_id=msg.rpc_id, response=response):
            answered += 1
    return answered


# --- waiting for a plain run ------------------------------------------------------------------


def _round_state(pk: int) -> tuple[str, int] | None:
    status = Task.objects.filter(pk=pk).values_list("status", flat=True).first()
    if status is None:
        return None
    return status, TaskMessage.objects.filter(task_id=pk, answered_at__isnull=True).count()


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


# --- the wire form of a task in this era ------------------------------------------------------


def wire_status(task: Task) -> str:
    """The extension's status: a tool that ran and reported ``isError`` is ``completed``.

    The store keeps 2025-11-25's reading (such a run is ``failed`` with a result); in this era
    ``failed`` is reserved for JSON-RPC errors.
    """
    if task.status == TaskStatus.FAILED and task.error is None and task.result is not None:
        return TaskStatus.COMPLETED.value
    return str(task.status)


def task_object(task: Task) -> dict[str, Any]:
    """The flat Task of the extension."""
    return task_wire(
        task_id=task.task_id, status=wire_status(task), status_message=task.status_message or None,
        created_at=_iso(task.created_at), last_updated_at=_iso(task.last_updated_at),
        ttl_ms=task.ttl_ms, poll_interval_ms=task.poll_interval_ms,
    )


def call_result(result: dict[str, Any] | None) -> dict[str, Any]:
    """What a ``tools/call`` returns in this era, from a stored result."""
    out = dict(result or {"content": []})
    meta = {k: v for k, v in (out.get("_meta") or {}).items() if k != RELATED_TASK}
    if meta:
        out["_meta"] = meta
    else:
        out.pop("_meta", None)
    out.setdefault("content", [])
    return {"resultType": "complete", **out}


def detailed_task(task: Task, *, requests: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """``tasks/get``: the task plus ``inputRequests``, ``result`` or ``error`` as its status says.

    ``requests``: the task's outstanding input requests, if the caller read them already (see
    :func:`apending_requests`); otherwise they are read here (sync) when the status needs them.
    """
    out: dict[str, Any] = {"resultType": "complete", **task_object(task)}
    status = out["status"]
    if status == TaskStatus.INPUT_REQUIRED:
        if requests is None:
            requests = pending_requests(task=task)
        if requests:
            out["inputRequests"] = requests
        else:
            out["status"] = TaskStatus.WORKING.value  # answered a moment ago; the tool resumes
    elif status == TaskStatus.COMPLETED:
        out["result"] = call_result(task.result)
    elif status == TaskStatus.FAILED:
        out["error"] = dict(task.error or {"code": -32603, "message": task.status_message or "Task failed"})
    return out
