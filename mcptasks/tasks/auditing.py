"""Audit events the task engine writes for a caller (one INSERT each; sealed into chains later)."""

from __future__ import annotations

from typing import Any

from mcptasks.audit import trail as audit
from mcptasks.models import Task
from tenants.auth import AuthContext


async def arecord_task_retrieval(*, auth: AuthContext, task: Task) -> None:
    """Audit that the caller fetched a task's outcome (``tasks/result``); no thread hop on PostgreSQL."""
    await audit.aappend(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action="task.result",
                        task_id=task.task_id, data={"status": task.status})


def record_audit(*, auth: AuthContext, action: str, task_id: str = "", data: dict[str, Any] | None = None) -> None:
    """Append an audit event for the caller."""
    record_audit_ids(
        tenant_id=auth.tenant_id, principal_id=auth.principal_id, action=action, task_id=task_id, data=data
    )


def record_audit_ids(
    *, tenant_id: int | None, principal_id: int | None, action: str, task_id: str = "",
    data: dict[str, Any] | None = None,
) -> None:
    """Append an audit event (one INSERT; :func:`mcptasks.audit.trail.seal` chains it shortly after)."""
    audit.append(tenant_id=tenant_id, principal_id=principal_id, action=action, task_id=task_id, data=data)
