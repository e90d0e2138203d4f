"""Create many task rows at once (throughput tests and benchmarks; not an MCP code path).

Rows are what ``creation.create_task`` writes for the anonymous principal of the default
tenant, created with ``bulk_create`` in batches, with the quota counters raised to match and
one worker wake-up per batch once it is committed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from mcptasks import conf
from mcptasks.models import Task, TaskStatus
from mcptasks.streams import signals
from mcptasks.tools.registry import registry
from tenants import quotas
from tenants.models import Principal, Tenant
from tenants.services import anonymous_principal, default_tenant


def enqueue(*, tool_name: str, arguments: list[dict[str, Any]], session_id: str = "",
            batch_size: int = 1000, ttl_ms: int = 3_600_000,
            committed: Callable[[], None] | None = None) -> list[str]:
    """Create one task per entry of ``arguments``; returns their task ids in order.

    ``committed`` runs right after each batch commits, before the wake-up is sent (benchmarks
    use it to timestamp the commit).
    """
    tool = registry.get_tool(tool_name)
    if tool is None:
        raise ValueError(f"unknown tool {tool_name}")
    tenant = default_tenant()
    principal = anonymous_principal(tenant=tenant)
    max_attempts = conf.get().TASK_MAX_ATTEMPTS if tool.retryable else 1
    ids: list[str] = []
    for start in range(0, len(arguments), batch_size):
        chunk = arguments[start:start + batch_size]
        now = timezone.now()
        rows = [
            Task(
                kind=Task.Kind.TASK, tenant_id=tenant.pk, principal_id=principal.pk, session_id=session_id,
                status=TaskStatus.WORKING, method="tools/call", tool_name=tool.name,
                params={"name": tool.name, "arguments": args}, request_id=start + i, progress_token=None,
                ttl_ms=ttl_ms, poll_interval_ms=1000, created_at=now, last_updated_at=now,
                expires_at=now + dt.timedelta(milliseconds=ttl_ms), max_attempts=max_attempts,
            )
            for i, args in enumerate(chunk)
        ]
        with transaction.atomic():
            Task.objects.bulk_create(rows)
            # Keep the quota counters consistent: each terminal transition gives one back (only
            # tenants with a limit have counters kept, see tenants.quotas).
            if quotas.is_counted((tenant.max_concurrent_tasks, tenant.max_concurrent_tasks_per_principal)):
                Tenant.objects.filter(pk=tenant.pk).update(active_tasks=F("active_tasks") + len(rows))
                Principal.objects.filter(pk=principal.pk).update(active_tasks=F("active_tasks") + len(rows))
            if committed is not None:
                transaction.on_commit(committed)
            transaction.on_commit(signals.wake_workers)
        ids.extend(r.task_id for r in rows)
    return ids
