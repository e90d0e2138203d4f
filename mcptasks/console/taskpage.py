"""What the console's task page shows (the admin's task view and its live JSON).

The page shows a task's arguments, status message, progress, result or error, the requests it
sent its client for input (elicitation, sampling) with the answers, attempts and worker, and its
durations. Large documents are cut to :data:`INLINE_CHARS` characters with a download of the
whole; the worker is an opaque label unless the operator sees every tenant
(:func:`mcptasks.console.operators.worker_label`). Scoping is the admin's (:class:`mcptasks.console.admin.TaskAdmin`).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from mcptasks.console import operators
from mcptasks.models import Task

#: Characters of one JSON document (arguments, result, error) shown inline; beyond, a download.
INLINE_CHARS = 20_000
#: Characters of one input request or answer shown inline.
MESSAGE_CHARS = 4_000
#: Input requests listed (the newest).
MAX_MESSAGES = 50
#: Documents the page offers for download.
PARTS = ("arguments", "result", "error")


def durations(task: Task, *, now: dt.datetime) -> dict[str, float | None]:
    """Seconds queued (created to first claimed), running (claimed to finished or now) and in total."""
    end = task.finished_at or now
    started = task.started_at
    queued = ((started or end) - task.created_at).total_seconds()
    running = (end - started).total_seconds() if started is not None else None
    return {"queued": max(0.0, queued), "running": None if running is None else max(0.0, running),
            "total": max(0.0, (end - task.created_at).total_seconds())}


def _document(task: Task, part: str) -> Any:
    if part == "arguments":
        return (task.params or {}).get("arguments", {}) if isinstance(task.params, dict) else task.params
    return task.result if part == "result" else task.error


def full_json(task: Task, part: str) -> str:
    """The whole document ``part`` of ``task`` as indented JSON."""
    return json.dumps(_document(task, part), indent=2, sort_keys=True, default=str)


def _capped(text: str, limit: int) -> dict[str, Any]:
    return {"text": text[:limit], "truncated": len(text) > limit, "size": len(text)}


def page(task: Task, *, all_tenants: bool, now: dt.datetime) -> dict[str, Any]:
    """Everything the task page renders."""
    docs = {}
    for part in PARTS:
        if part != "arguments" and _document(task, part) is None:
            continue
        docs[part] = _capped(full_json(task, part), INLINE_CHARS)
    requests = []
    for msg in task.messages.order_by("-created_at")[:MAX_MESSAGES]:
        requests.append({
            "method": msg.method, "created_at": msg.created_at, "answered_at": msg.answered_at,
            "request": _capped(json.dumps(msg.params, indent=2, sort_keys=True, default=str), MESSAGE_CHARS),
            "answer": (_capped(json.dumps(msg.response, indent=2, sort_keys=True, default=str), MESSAGE_CHARS)
                       if msg.response is not None else None),
        })
    requests.reverse()
    return {"documents": docs, "requests": requests, "max_attempts": task.max_attempts,
            "started_at": task.started_at}


def live(task: Task, *, all_tenants: bool, now: dt.datetime) -> dict[str, Any]:
    """The part of the page that changes while the task runs (the page polls it as JSON)."""
    progress = task.progress if isinstance(task.progress, dict) else None
    percent = None
    if progress and isinstance(progress.get("total"), int | float) and progress["total"]:
        percent = max(0.0, min(100.0, 100.0 * float(progress.get("progress") or 0) / float(progress["total"])))
    return {
        "status": task.status,
        "terminal": task.is_terminal,
        "status_message": task.status_message or "",
        "progress": progress,
        "percent": percent,
        "attempt": task.attempt,
        "worker": operators.worker_label(task.worker_id, all_tenants=all_tenants),
        "durations": durations(task, now=now),
        "last_updated_at": task.last_updated_at.isoformat(),
    }
