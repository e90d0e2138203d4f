"""State of the MCP server: sessions, tasks, queued task messages, stream events, workers, audit.

Models hold state and the named, conditional transitions of :class:`TaskQuerySet`; the rules
live in :mod:`mcptasks.tasks`. Every model is importable from here (``mcptasks.models.Task``),
which is also where the migrations find the callables they reference.
"""

from mcptasks.models.audit import AuditAnchor, AuditEvent
from mcptasks.models.claimsql import Claimed
from mcptasks.models.sessions import McpSession, new_session_id
from mcptasks.models.status import LIVE, TERMINAL, TaskStatus
from mcptasks.models.streams import StreamCursor, StreamEvent
from mcptasks.models.taskqueries import Outcome, TaskQuerySet, tool_lock_key
from mcptasks.models.tasks import Task, TaskMessage, new_task_id, wire_time
from mcptasks.models.webhooks import WebhookDelivery, new_webhook_message_id
from mcptasks.models.workers import WorkerHeartbeat

__all__ = [
    "LIVE",
    "TERMINAL",
    "AuditAnchor",
    "AuditEvent",
    "Claimed",
    "McpSession",
    "Outcome",
    "StreamCursor",
    "StreamEvent",
    "Task",
    "TaskMessage",
    "TaskQuerySet",
    "TaskStatus",
    "WebhookDelivery",
    "WorkerHeartbeat",
    "new_session_id",
    "new_task_id",
    "new_webhook_message_id",
    "tool_lock_key",
    "wire_time",
]
