"""The wire form of a task in each era, defined once (pure: no database, no I/O).

2025-11-25: the Task object itself is :meth:`mcptasks.models.Task.wire` (the fast reads build
it from a row); here its status notification, a plain request's response and what
``tasks/result`` returns. 2026-07-28: the flat Task of the extension, its status reading,
``inputRequests`` and a ``tools/call`` result.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from mcptasks.models import Task, TaskMessage, TaskStatus, wire_time
from mcptasks.protocol.era2026 import INPUT_KEY_PATTERN, task_wire
from mcptasks.protocol.errors import INTERNAL_ERROR
from mcptasks.protocol.messages import RELATED_TASK, related_task_meta
from mcptasks.tools.context import INPUT_KEY_META

# --- 2025-11-25 -------------------------------------------------------------------------------


CANCELLED_ERROR = {"code": INTERNAL_ERROR, "message": "Task was cancelled"}


def status_notification(task: Task) -> dict[str, Any]:
    """``notifications/tasks/status`` of a task (2025-11-25)."""
    return {"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": task.wire()}


def request_outcome_message(task: Task) -> dict[str, Any]:
    """What a plain request's POST stream gets when its task ended."""
    if task.status == TaskStatus.CANCELLED:
        # The spec: no response is sent for a cancelled request. End the stream instead.
        return {"_end": True}
    if task.error is not None:
        return {"jsonrpc": "2.0", "id": task.request_id, "error": task.error}
    return {"jsonrpc": "2.0", "id": task.request_id, "result": task.result or {"content": []}}


def task_result_payload(*, task: Task) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(result, error) that ``tasks/result`` returns for a terminal task.

    Exactly what the underlying request would have returned, plus the related-task ``_meta``
    on a result.
    """
    if task.error is not None:
        return None, dict(task.error)
    if task.status == TaskStatus.CANCELLED and task.result is None:
        return None, dict(CANCELLED_ERROR)
    result = dict(task.result or {"content": []})
    meta = dict(result.get("_meta") or {})
    meta.update(related_task_meta(task.task_id))
    result["_meta"] = meta
    return result, None


# --- 2026-07-28 -------------------------------------------------------------------------------


_INPUT_KEY = re.compile(INPUT_KEY_PATTERN)


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


def requests_by_key(messages: Iterable[TaskMessage]) -> dict[str, dict[str, Any]]:
    """``inputRequests`` from one task's outstanding messages, given oldest first."""
    return {input_key(m): input_request(m) for m in messages}


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
        created_at=wire_time(task.created_at), last_updated_at=wire_time(task.last_updated_at),
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
