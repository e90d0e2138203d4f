"""The audit trail the services write: creation, outcome, retrieval, failed lookups; hash chain."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from mcptasks import handlers, services
from mcptasks.models import AuditEvent, McpSession, Task
from mcptasks.protocol.errors import McpError
from mcptasks.protocol.messages import TaskIdParams
from tenants.auth import AuthContext

pytestmark = pytest.mark.django_db


def ctx_for(auth: AuthContext, session: McpSession) -> handlers.RequestContext:
    async def no_stream(prefix: str) -> str:
        raise AssertionError("no stream expected")

    return handlers.RequestContext(auth=auth, session=session, protocol_version="2025-11-25", request_id=1,
                                   open_stream=no_stream)


def test_retrieval_and_failed_lookups_are_audited(auth: AuthContext, session: McpSession,
                                                  task_factory: Any) -> None:
    task: Task = task_factory()
    assert services.transition(task=task, to="completed", result={"content": []})
    ctx = ctx_for(auth, session)
    async_to_sync(handlers.tasks_result)(ctx, TaskIdParams(taskId=task.task_id))
    with pytest.raises(McpError):
        async_to_sync(handlers.tasks_get)(ctx, TaskIdParams(taskId="no-such-task"))
    actions = list(AuditEvent.objects.filter(tenant_id=auth.tenant_id).values_list("action", flat=True))
    assert "task.result" in actions
    failed = AuditEvent.objects.get(action="task.lookup_failed")
    assert failed.data["taskId"] == "no-such-task" and failed.data["method"] == "tasks/get"
    assert failed.principal_id == auth.principal_id


def test_each_audit_event_hash_covers_the_previous_one(auth: AuthContext, session: McpSession,
                                                       task_factory: Any) -> None:
    for _ in range(3):
        services.record_audit(auth=auth, action="test.event", data={"n": 1})
    events = list(AuditEvent.objects.filter(tenant_id=auth.tenant_id).order_by("id"))
    assert len(events) >= 3
    prev = ""
    for ev in events:
        assert ev.prev_hash == prev
        body = json.dumps({"t": ev.tenant_id, "p": ev.principal_id, "a": ev.action, "task": ev.task_id,
                           "d": ev.data, "prev": prev}, sort_keys=True, default=str)
        assert ev.hash == hashlib.sha256(body.encode()).hexdigest()
        prev = ev.hash
