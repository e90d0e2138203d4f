"""``manage.py mcptasks_tenant``."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tenants.auth import authenticate
from tenants.models import Tenant

pytestmark = pytest.mark.django_db


def _run(*args: str) -> list[str]:
    out = StringIO()
    call_command("mcptasks_tenant", *args, stdout=out)
    return out.getvalue().splitlines()


def test_create_and_token_last_line_works(resource_url: str) -> None:
    assert "created" in _run("create", "globex", "--name", "Globex Corp")[-1]
    assert Tenant.objects.get(slug="globex").name == "Globex Corp"
    assert "already exists" in _run("create", "globex")[-1]
    token = _run("token", "globex", "--principal", "ops", "--scopes", "mcp:tools", "mcp:tasks")[-1]
    ctx = authenticate(
        headers={"authorization": f"Bearer {token}"}, query_string="", resource_url=resource_url
    )
    assert ctx.tenant_slug == "globex" and ctx.principal_name == "ops"
    assert ctx.scopes == frozenset({"mcp:tools", "mcp:tasks"})


def test_token_bound_to_resource(resource_url: str) -> None:
    _run("create", "globex")
    token = _run("token", "globex", "--resource", resource_url, "--expires-s", "60")[-1]
    headers = {"authorization": f"Bearer {token}"}
    assert authenticate(headers=headers, query_string="", resource_url=resource_url).tenant_slug == "globex"
    from tenants.auth import AuthError

    with pytest.raises(AuthError):
        authenticate(headers=headers, query_string="", resource_url="http://other:9/mcp")


def test_errors() -> None:
    with pytest.raises(CommandError, match="unknown tenant"):
        _run("token", "nope")
    _run("create", "globex")
    with pytest.raises(CommandError, match="unknown scope"):
        _run("token", "globex", "--scopes", "root")


def test_list_and_app(tenant: Any) -> None:
    assert _run("list")[0].startswith("acme\tactive")
    lines = _run("app", "acme", "--name", "worker")
    assert lines[0].startswith("client_id=") and lines[1].startswith("client_secret=")
    lines = _run("app", "acme", "--grant", "authorization-code", "--redirect-uri", "http://127.0.0.1:9/cb")
    assert lines[0].startswith("client_id=") and len(lines) == 2


def test_app_for_an_auditor_with_the_audit_scope(tenant: Any) -> None:
    from django.contrib.auth import get_user_model
    from oauth2_provider.models import get_application_model

    auditor = get_user_model().objects.create_user(username="aud", password="pw")
    lines = _run("app", "acme", "--name", "audit-bot", "--scopes", "audit:read", "--owner", "aud")
    client_id = lines[0].removeprefix("client_id=")
    app = get_application_model().objects.get(client_id=client_id)
    assert app.user == auditor and app.tenant_link.allowed_scopes == "audit:read"
    with pytest.raises(CommandError, match="unknown user"):
        _run("app", "acme", "--owner", "nobody")
    with pytest.raises(CommandError, match="client-credentials"):
        _run("app", "acme", "--grant", "authorization-code", "--redirect-uri", "http://127.0.0.1:9/cb",
             "--owner", "aud")


@pytest.mark.django_db
def test_recount_repairs_counters_from_the_task_table() -> None:
    """After a crash or a manual edit the counters can drift; recount puts them right."""
    from io import StringIO

    from django.core.management import call_command
    from django.utils import timezone

    from mcptasks.models import Task
    from tenants.models import Principal, Tenant
    from tenants.services import get_or_create_principal, get_or_create_tenant

    tenant = get_or_create_tenant(slug="drift")
    alice = get_or_create_principal(tenant=tenant, kind="client", identifier="alice")
    now = timezone.now()
    for status in ("working", "input_required", "completed"):
        Task.objects.create(tenant=tenant, principal=alice, session_id="s", tool_name="t", status=status,
                            created_at=now, last_updated_at=now)
    Tenant.objects.filter(pk=tenant.pk).update(active_tasks=9)
    Principal.objects.filter(pk=alice.pk).update(active_tasks=0)
    out = StringIO()
    call_command("mcptasks_tenant", "recount", "drift", stdout=out)
    assert "2 counter(s) corrected" in out.getvalue()
    assert Tenant.objects.get(pk=tenant.pk).active_tasks == 2
    assert Principal.objects.get(pk=alice.pk).active_tasks == 2
