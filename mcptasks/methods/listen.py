"""``subscriptions/listen``: what one listen stream agreed to, and what it sends.

A listen is an SSE response the consumer keeps open (``mcptasks.endpoint.listen_feed``). Its task
notifications ride on the same mechanism as a 2025-11-25 ``tasks/result`` stream: the consumer
joins each acknowledged task's group (:func:`mcptasks.streams.signals.task_group`), the ``task.signal``
that any process (web or worker) sends on a change wakes it, and while the channel layer fails
the consumer's fallback poll and its periodic re-check read the store instead. On every wake-up
this module re-reads the tasks (one read per wake-up, :func:`mcptasks.tasks.selectors.alive_tasks`) and
re-renders them with :func:`mcptasks.tasks.era2026_view.task_as_seen_by`, the function ``tasks/get``
answers with (both through :func:`~mcptasks.tasks.era2026_view.atasks_as_seen_by`), and hands back
only the ones that changed since they were last sent.

Only ``notifications/tasks`` is ever sent for a task: never progress or log messages.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from mcptasks.audit import watch
from mcptasks.methods.implementation import server_info
from mcptasks.protocol import jsonrpc, sse
from mcptasks.protocol.era2026 import COMPLETE, META_SERVER_INFO, META_SUBSCRIPTION_ID
from mcptasks.protocol.messages import TASK_ID_PATTERN
from mcptasks.tasks import auditing, selectors
from mcptasks.tasks.era2026_view import atasks_as_seen_by
from tenants.auth import AuthContext

_TASK_ID_RE = re.compile(TASK_ID_PATTERN)


def listenable(*, auth: AuthContext, task_ids: list[str]) -> list[str]:
    """The ids of ``task_ids`` the caller may watch, in the order asked, each once.

    Exactly what ``tasks/get`` would find: the caller's own live tasks, or the tenant's with
    ``mcp:tasks:tenant``. Malformed, unknown, expired and foreign ids are left out alike (and
    audited as failed lookups, which also flags enumeration and cross-tenant probes).
    """
    wanted = list(dict.fromkeys(t for t in task_ids if _TASK_ID_RE.fullmatch(t)))
    now = timezone.now()
    found = {
        t.task_id for t in selectors._task_queryset(auth=auth).filter(task_id__in=wanted).only(
            "task_id", "expires_at", "status")
        if not selectors.is_expired(t, now=now)
    } if wanted else set()
    for task_id in dict.fromkeys(task_ids):
        if task_id not in found:
            watch.lookup_failed(auth=auth, method="subscriptions/listen", task_id=task_id[:100],
                                error="Failed to retrieve task: Task not found")
    return [t for t in wanted if t in found]


def _frame(message: dict[str, Any]) -> bytes:
    return sse.event(json.dumps(message, separators=(",", ":")))


@dataclass
class Listen:
    """One open listen: its request id (the subscription id), what it agreed to, what it sent."""

    auth: AuthContext
    request_id: str | int
    agreed: dict[str, Any]
    task_ids: list[str]
    #: A digest of the last state sent per task id: a wake-up that changed nothing sends nothing.
    sent: dict[str, bytes] = field(default_factory=dict)

    def _meta(self) -> dict[str, Any]:
        return {META_SUBSCRIPTION_ID: self.request_id}

    def acknowledgement(self) -> bytes:
        """``notifications/subscriptions/acknowledged``: the first message of the stream."""
        return _frame(jsonrpc.notification("notifications/subscriptions/acknowledged",
                                           {"notifications": self.agreed, "_meta": self._meta()}))

    def ending(self) -> bytes:
        """The ``SubscriptionsListenResult`` that ends the stream gracefully (shutdown, lifetime bound)."""
        return _frame(jsonrpc.response(self.request_id, {
            "resultType": COMPLETE,
            "_meta": {**self._meta(), META_SERVER_INFO: server_info()},
        }))

    async def changes(self, task_ids: list[str] | None = None) -> list[bytes]:
        """``notifications/tasks`` for each of ``task_ids`` (default: all) whose state changed."""
        ids = [t for t in (task_ids if task_ids is not None else self.task_ids) if t in self.task_ids]
        if not ids:
            return []
        # One read for every task of the wake-up, and the tasks/get rendering, with no thread
        # hop on PostgreSQL: this is the listen's whole latency budget on the web side.
        found = await selectors.alive_tasks(auth=self.auth, task_ids=ids)
        rendered_views = await atasks_as_seen_by(found, principal_id=self.auth.principal_id)
        views = {task.task_id: (task, view) for task, view in zip(found, rendered_views, strict=True)}
        frames = []
        for task_id in ids:
            if task_id not in views:
                continue  # gone (expired, deleted): nothing more to say about it
            task, view = views[task_id]
            params = {k: v for k, v in view.items() if k != "resultType"}
            # A digest, not the rendering: a listen holds 32 bytes per task, whatever its result's size.
            rendered = hashlib.sha256(json.dumps(params, sort_keys=True, separators=(",", ":")).encode()).digest()
            if self.sent.get(task_id) == rendered:
                continue
            self.sent[task_id] = rendered
            if "result" in params:
                # Delivering an outcome is a retrieval, audited as tasks/get's is.
                await auditing.arecord_task_retrieval(auth=self.auth, task=task)
            frames.append(_frame(jsonrpc.notification("notifications/tasks", {**params, "_meta": self._meta()})))
        return frames
