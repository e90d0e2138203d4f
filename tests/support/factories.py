"""Factories for in-process tests: tenants, principals, auth contexts, sessions and tasks (one place)."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable
from typing import Any

from django.db import connection
from django.utils import timezone

from mcptasks.models import McpSession, Task
from mcptasks.tasks import creation
from mcptasks.tools.registry import Tool, registry
from tenants.auth import AuthContext

_seq = itertools.count(1)


def make_tenant(slug: str | None = None, **limits: Any) -> Any:
    """A tenant (no limits unless given as keyword arguments)."""
    from tenants.models import Tenant

    return Tenant.objects.create(slug=slug or f"t{next(_seq)}", **limits)


def make_auth(tenant: Any = None, identifier: str | None = None, *, scopes: str = "mcp:tools mcp:tasks") -> AuthContext:
    """An authenticated (non-anonymous) auth context of a new or given tenant."""
    from tenants.models import Principal

    tenant = tenant or make_tenant()
    principal = Principal.objects.create(
        tenant=tenant, kind=Principal.Kind.CLIENT, identifier=identifier or f"p{next(_seq)}"
    )
    return AuthContext(
        tenant_id=tenant.pk,
        tenant_slug=tenant.slug,
        principal_id=principal.pk,
        principal_name=principal.identifier,
        scopes=frozenset(scopes.split()),
    )


def make_session(auth: AuthContext) -> McpSession:
    """An initialized 2025-11-25 session of ``auth``."""
    return McpSession.objects.create(
        tenant_id=auth.tenant_id, principal_id=auth.principal_id, protocol_version="2025-11-25",
        client_capabilities={}, initialized=True,
    )


def demo_tool(name: str = "demo_sleep") -> Tool:
    tool = registry.get_tool(name)
    assert tool is not None, f"{name} is not registered"
    return tool


def make_task(auth: AuthContext, session: McpSession | None = None, *, ttl_ms: int | None = None,
              tool: str = "demo_sleep") -> Task:
    """A task created through the real service (quota slot, audit, ttl clamping)."""
    return creation.create_task(
        auth=auth, session=session or make_session(auth), tool=demo_tool(tool), arguments={"ms": 1},
        request_id=next(_seq), progress_token=None, requested_ttl_ms=ttl_ms,
    )


def expire(task: Task, *, ago_s: float = 1.0) -> None:
    """Move a task's expiry into the past (as if its ttl had elapsed)."""
    Task.objects.filter(pk=task.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=ago_s))


def in_thread_db(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Wrap ``fn`` for a thread: it gets its own DB connection, closed when done."""

    def run() -> Any:
        try:
            return fn()
        finally:
            connection.close()

    return run


def task_row(tool: str, *, auth: AuthContext | None = None, max_attempts: int = 1, **fields: Any) -> Task:
    """A task row written directly (any tool name, any fields), for tests of the worker's claims.

    Without ``auth``, the row belongs to the anonymous principal of the default tenant.
    """
    from tenants.models import Principal, Tenant
    from tenants.services import anonymous_principal, default_tenant

    if auth is None:
        tenant = default_tenant()
        principal = anonymous_principal(tenant=tenant)
    else:
        tenant = Tenant.objects.get(pk=auth.tenant_id)
        principal = Principal.objects.get(pk=auth.principal_id)
    now = timezone.now()
    return Task.objects.create(
        tenant=tenant, principal=principal, session_id="s", tool_name=tool,
        params={"name": tool, "arguments": {}}, created_at=now, last_updated_at=now, max_attempts=max_attempts,
        ttl_ms=60_000, **fields,
    )
