"""Item 1: an OAuth client cannot grant itself scopes; operators grant them per application."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from oauth2_provider.models import get_access_token_model, set_token_value

from mcptasks.models import AuditEvent
from tenants.auth import authenticate
from tenants.services import create_client_application

pytestmark = pytest.mark.django_db

RESOURCE = "http://testserver/mcp"


def _token(client_id: str, secret: str, scope: str | None) -> Any:
    data = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}
    if scope is not None:
        data["scope"] = scope
    return Client().post("/o/token/", data)


def test_client_cannot_ask_for_the_tenant_wide_scope(tenant_a: Any) -> None:
    link, secret = create_client_application(tenant=tenant_a, principal_name="ordinary")
    assert link.allowed_scopes == "mcp:tools mcp:tasks"  # least privilege by default
    response = _token(link.application.client_id, secret, "mcp:tools mcp:tasks mcp:tasks:tenant")
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid_scope"
    event = AuditEvent.objects.filter(action="oauth.invalid_scope").get()
    assert event.tenant_id == tenant_a.pk and "mcp:tasks:tenant" in event.data["requested"]


def test_default_scopes_are_the_granted_ones(tenant_a: Any) -> None:
    link, secret = create_client_application(tenant=tenant_a, principal_name="ordinary")
    response = _token(link.application.client_id, secret, None)
    assert response.status_code == 200, response.content
    assert set(response.json()["scope"].split()) == {"mcp:tools", "mcp:tasks"}


def test_operator_grant_allows_the_scope(tenant_a: Any) -> None:
    link, secret = create_client_application(
        tenant=tenant_a, principal_name="auditor", scopes=["mcp:tools", "mcp:tasks", "mcp:tasks:tenant"]
    )
    response = _token(link.application.client_id, secret, "mcp:tasks:tenant")
    assert response.status_code == 200, response.content


def test_existing_token_loses_scopes_the_application_no_longer_has(tenant_a: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    link, _secret = create_client_application(tenant=tenant_a, principal_name="ordinary")
    access = get_access_token_model()(
        application=link.application, user=None, expires=timezone.now() + timedelta(hours=1),
        scope="mcp:tools mcp:tasks mcp:tasks:tenant", resource=[],
    )
    set_token_value(access, "tok-" + "x" * 40)
    access.save()
    ctx = authenticate(headers={"authorization": "Bearer tok-" + "x" * 40}, query_string="", resource_url=RESOURCE)
    assert ctx.scopes == frozenset({"mcp:tools", "mcp:tasks"})
    assert not ctx.has_scope("mcp:tasks:tenant")
