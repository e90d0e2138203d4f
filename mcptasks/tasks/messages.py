"""Task messages: the server->client requests of a running tool (elicitation, sampling), their
delivery and their answers, and the tasks/result stream they are delivered on."""

from __future__ import annotations

import secrets
from typing import Any

from django.utils import timezone

from mcptasks.models import Task, TaskMessage, TaskStatus
from mcptasks.protocol.messages import related_task_meta
from mcptasks.streams import events, signals
from mcptasks.tasks import selectors, transitions
from tenants.auth import AuthContext


def add_task_message(*, task: Task, method: str, params: dict[str, Any]) -> TaskMessage:
    """Queue a server->client request of a running tool and move the task to input_required."""
    rpc_id = "mcpt-" + secrets.token_urlsafe(12)
    params = dict(params)
    if task.kind == Task.Kind.TASK:
        meta = dict(params.get("_meta") or {})
        meta.update(related_task_meta(task.task_id))
        params["_meta"] = meta
    msg = TaskMessage.objects.create(task=task, rpc_id=rpc_id, method=method, params=params)
    if task.kind == Task.Kind.TASK:
        transitions.transition(task=task, to=TaskStatus.INPUT_REQUIRED)
    else:
        # A plain request's stream is its POST stream: deliver right away.
        deliver_task_message(task=task, message=msg, stream_id=task.stream_id or "")
    signals.signal_task(task.task_id, "message", rpc_id=rpc_id)
    return msg


def deliver_task_message(*, task: Task, message: TaskMessage, stream_id: str) -> None:
    """Send a queued request on a stream (the tasks/result stream or a plain call's POST)."""
    TaskMessage.objects.filter(pk=message.pk).update(delivered_at=timezone.now())
    events.publish(
        session_id=task.session_id,
        stream_id=stream_id,
        message={"jsonrpc": "2.0", "id": message.rpc_id, "method": message.method, "params": message.params},
    )


def answer_task_message(*, auth: AuthContext, rpc_id: str, response: dict[str, Any]) -> bool:
    """Store the client's JSON-RPC response to a queued request and wake the tool.

    Returns False when no pending request of this principal has that id.
    """
    msg = (
        TaskMessage.objects.select_related("task")
        .filter(rpc_id=rpc_id, task__tenant_id=auth.tenant_id, task__principal_id=auth.principal_id)
        .first()
    )
    if msg is None:
        return False
    changed = TaskMessage.objects.filter(pk=msg.pk, answered_at__isnull=True).update(
        response=response, answered_at=timezone.now()
    )
    if not changed:
        return True  # a duplicate answer: the first one counts
    task = msg.task
    if task.kind == Task.Kind.TASK and not selectors.pending_input(task_ids=[task.pk]).exists():
        transitions.transition(task=task, to=TaskStatus.WORKING)
    signals.signal_task(task.task_id, "answer", rpc_id=rpc_id, worker_id=task.worker_id)
    return True


def bind_result_stream(
    *, auth: AuthContext, task: Task, stream_id: str | None, only_if: str | None = None,
    only_if_unbound: bool = False,
) -> bool:
    """Attach (or detach, with None) the tasks/result stream that receives the task's messages.

    Only the task's own principal ever receives its input requests: a tenant-wide reader
    (``mcp:tasks:tenant``) may wait for the status and the result, but its stream is never
    bound, so it can neither see nor take over the owner's elicitations. ``only_if``: only
    while that stream is bound; ``only_if_unbound``: only while none is. Returns whether the
    binding changed.
    """
    qs = Task.objects.filter(pk=task.pk, tenant_id=auth.tenant_id, principal_id=auth.principal_id)
    if only_if is not None:
        qs = qs.filter(stream_id=only_if)
    if only_if_unbound:
        qs = qs.filter(stream_id__isnull=True)
    return bool(qs.update(stream_id=stream_id))
