"""How a 2026-07-28 client sees a task: the one rendering that ``tasks/get``, a listen's
``notifications/tasks`` and a webhook's body share, with the outstanding input requests it shows.

Reads only (no writes): below the era's writes (:mod:`mcptasks.tasks.era2026`) and the webhook
outbox (:mod:`mcptasks.tasks.webhook_outbox`), which both render through it.
"""

from __future__ import annotations

from typing import Any

from mcptasks.models import Task, TaskMessage, TaskStatus
from mcptasks.protocol.era2026 import era_error
from mcptasks.protocol.errors import McpError
from mcptasks.tasks import selectors, wire


def pending_requests(*, task: Task) -> dict[str, dict[str, Any]]:
    """Every outstanding input request of ``task`` by key (oldest first)."""
    return wire.requests_by_key(selectors.pending_input(task_ids=[task.pk]))


async def apending_requests(*, tasks: list[Task]) -> dict[int, dict[str, dict[str, Any]]]:
    """:func:`pending_requests` of several tasks (by pk) from async code, in one query
    (:func:`~mcptasks.tasks.selectors.apending_input`: no thread hop on PostgreSQL)."""
    pks = [t.pk for t in tasks]
    if not pks:
        return {}
    grouped: dict[int, list[TaskMessage]] = {pk: [] for pk in pks}
    for m in await selectors.apending_input(task_ids=pks):
        grouped[m.task_id].append(m)
    return {pk: wire.requests_by_key(group) for pk, group in grouped.items()}


def pending_count(*, task: Task) -> int:
    """How many of the task's requests wait for an answer (sync; call from a thread or a sync path)."""
    return selectors.pending_input(task_ids=[task.pk]).count()


def detailed_task(task: Task, *, requests: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """``tasks/get``: the task plus ``inputRequests``, ``result`` or ``error`` as its status says.

    ``requests``: the task's outstanding input requests, if the caller read them already (see
    :func:`apending_requests`); otherwise they are read here (sync) when the status needs them.
    """
    out: dict[str, Any] = {"resultType": "complete", **wire.task_object(task)}
    status = out["status"]
    if status == TaskStatus.INPUT_REQUIRED:
        if requests is None:
            requests = pending_requests(task=task)
        if requests:
            out["inputRequests"] = requests
        else:
            out["status"] = TaskStatus.WORKING.value  # answered a moment ago; the tool resumes
    elif status == TaskStatus.COMPLETED:
        out["result"] = wire.call_result(task.result)
    elif status == TaskStatus.FAILED:
        out["error"] = dict(task.error or {"code": -32603, "message": task.status_message or "Task failed"})
    return out


def task_as_seen_by(task: Task, *, principal_id: int | None,
                    requests: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """``tasks/get``'s answer about ``task`` for ``principal_id`` (None: a tenant-wide reader).

    The one rendering of a DetailedTask: also what ``notifications/tasks`` carries on a listen
    (:mod:`mcptasks.methods.listen`) and the body of a webhook event (:mod:`mcptasks.streams.webhooks`), so what a
    listener or an endpoint receives is exactly what its principal would read. Sync: it reads
    the pending input requests of an ``input_required`` task unless given them (``requests``,
    as :func:`atasks_as_seen_by` reads them).
    """
    detailed = detailed_task(task, requests=requests)
    if task.principal_id != principal_id:
        # A tenant-wide reader sees the status, never the owner's elicitation text or sampling
        # prompts (the 2025-11-25 path never binds its stream either).
        detailed.pop("inputRequests", None)
    if "error" in detailed:
        detailed["error"] = era_error(McpError.from_error(detailed["error"])).to_error()
    return detailed


async def atasks_as_seen_by(found: list[Task], *, principal_id: int | None) -> list[dict[str, Any]]:
    """:func:`task_as_seen_by` of each of ``found`` from async code, without a thread hop on
    PostgreSQL: the outstanding input requests of the ``input_required`` ones are read in one
    query (:func:`apending_requests`), then each task is rendered by the same function."""
    waiting = [t for t in found if t.status == TaskStatus.INPUT_REQUIRED]
    requests = await apending_requests(tasks=waiting) if waiting else {}
    return [task_as_seen_by(t, principal_id=principal_id, requests=requests.get(t.pk, {})) for t in found]
