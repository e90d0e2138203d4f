"""Fan-out after a task changed: the status notification on the requestor's stream, a plain
request's response on its POST stream, and the task's signal (waiters, its runner)."""

from __future__ import annotations

import functools
import json
from typing import Any

from mcptasks.models import McpSession, Task
from mcptasks.protocol.era2026 import VERSION as ERA2026_VERSION
from mcptasks.streams import events, signals
from mcptasks.tasks import wire


def after_change(task: Task) -> None:
    """Tell waiters (always) and the requestor (tasks only) that the task changed."""
    if task.kind == Task.Kind.TASK:
        message = wire.status_notification(task)
        if not _is_request_session(task.session_id):
            publish_for_task(task=task, message=message)
        else:
            # Only a 2025-11-25 tasks/result stream bound to the task could read it (a client
            # of that era may wait on a task created in this one): published there, as before.
            bound = Task.objects.filter(pk=task.pk).values_list("stream_id", flat=True).first()
            if bound:
                events.publish(session_id=task.session_id, stream_id=bound, message=message)
    elif task.is_terminal and task.stream_id:
        _publish_request_outcome(task)
    signals.signal_task(task.task_id, "changed", status=task.status)


@functools.lru_cache(maxsize=4096)
def _is_request_session(session_id: str) -> bool:
    """Whether ``session_id`` is the session row of one 2026-07-28 request.

    No client ever holds such a session (the era has none): nobody can open or resume its GET
    stream, so a ``notifications/tasks/status`` stored there would be read by no one. Skipping it
    spares each status change a transaction and a channel-layer send before the task's signal,
    the wake-up of ``subscriptions/listen`` (the issue-29 latency budget). A session's protocol
    version never changes, so the answer is cached (sessions ids are server-made, bounded).
    """
    if not session_id:
        return False
    return McpSession.objects.filter(pk=session_id, protocol_version=ERA2026_VERSION).exists()


def after_changes(tasks: list[Task]) -> None:
    """:func:`after_change` for many tasks (a worker's batch of finishes), batched.

    The same notifications and signals, in the same order per stream, but one query finds the
    tasks' bound streams, one transaction stores every event (:func:`events.publish_many`) and one
    hop to the event loop sends the pushes and the task signals. What goes where is
    :func:`_notes`, as for the statement that stores the events with the change itself.
    """
    if not tasks:
        return
    if len(tasks) == 1:
        after_change(tasks[0])
        return
    notes = _notes(tasks)
    notified = [t.pk for t, (message, _d) in zip(tasks, notes, strict=True)
                if message is not None and t.kind == Task.Kind.TASK]
    open_streams = dict(
        Task.objects.filter(pk__in=notified).exclude(stream_id="").exclude(stream_id__isnull=True)
        .values_list("pk", "stream_id")
    ) if notified else {}
    items: list[tuple[str, str, dict[str, Any]]] = []
    for task, (message, default) in zip(tasks, notes, strict=True):
        bound = open_streams.get(task.pk) if task.kind == Task.Kind.TASK else task.stream_id
        stream = bound or default
        if message is not None and stream:
            items.append((task.session_id, stream, message))
    events.publish_many(items, signals=[signals.task_signal(t.task_id, "changed", status=t.status) for t in tasks])


def _notes(tasks: list[Task]) -> list[tuple[dict[str, Any] | None, str | None]]:
    """Per task (as it is once changed): its message (None: none) and the stream it goes on when
    no stream is bound to the task (None: only a bound stream gets it).

    A task's status notification goes on its bound tasks/result stream, else on the session's
    GET stream, except for the session of a 2026-07-28 request, whose GET stream nobody can read
    (only a bound stream gets it there). A plain request's response goes only on its own POST
    stream.
    """
    notes: list[tuple[dict[str, Any] | None, str | None]] = []
    for task in tasks:
        if task.kind == Task.Kind.TASK and task.session_id:
            default = None if _is_request_session(task.session_id) else events.get_stream_id(task.session_id)
            notes.append((wire.status_notification(task), default))
        elif task.kind != Task.Kind.TASK and task.is_terminal and task.stream_id:
            notes.append((wire.request_outcome_message(task), None))
        else:
            notes.append((None, None))
    return notes


def notes_for(tasks: list[Task]) -> list[tuple[str | None, str | None]]:
    """:func:`_notes` with each message as the JSON text a stored event holds, for a statement
    that stores the events with the change itself (:mod:`mcptasks.tasks.finishsql`)."""
    return [(None if message is None else events.encode(message), default) for message, default in _notes(tasks)]


def after_stored(*, tasks: list[Task], stored: list[tuple[str, int, str]],
                 unstored: list[tuple[str, str, str]]) -> None:
    """After a statement that changed ``tasks`` and stored their events (``(stream, seq, data)``):
    the pushes, then the task signals, in one hop to the event loop, as :func:`after_changes`
    sends them. ``unstored`` (``(session, stream, data)``: streams without a cursor row yet) are
    published first, the usual way."""
    task_signals = [signals.task_signal(t.task_id, "changed", status=t.status) for t in tasks]
    pushes = [events.push_of(stream_id=stream, seq=seq, data=data) for stream, seq, data in stored]
    if unstored:
        signals.send_many(pushes, [])
        events.publish_many([(session, stream, json.loads(data)) for session, stream, data in unstored],
                            signals=task_signals)
    else:
        signals.send_many(pushes, task_signals)


def _publish_request_outcome(task: Task) -> None:
    """A plain request ended: its response goes on the request's POST stream."""
    events.publish(session_id=task.session_id, stream_id=task.stream_id or "",
                   message=wire.request_outcome_message(task))


def stream_for_task(*, task: Task) -> str:
    """Where a task's messages go: its open tasks/result stream, else the session's GET stream."""
    current = Task.objects.filter(pk=task.pk).values_list("stream_id", flat=True).first()
    if current:
        return current
    return events.get_stream_id(task.session_id)


def publish_for_task(*, task: Task, message: dict[str, Any]) -> str | None:
    """Send a notification about ``task`` on exactly one stream of the requestor's session.

    A task created without a client session (bulk-enqueued: ``session_id`` empty) has nobody
    to notify; its status and result are read with ``tasks/get`` and ``tasks/result``.
    """
    if not task.session_id:
        return None
    stream = task.stream_id if task.kind == Task.Kind.REQUEST and task.stream_id else stream_for_task(task=task)
    return events.publish(session_id=task.session_id, stream_id=stream, message=message)
