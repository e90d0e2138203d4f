"""Issue 25 item 3: every foreign key a tenant admin edits stays inside its tenant.

The attacks, through the real admin over HTTP (CSRF on) as a tenant admin of A: bind A's OAuth
application to one of B's principals on A's tenant page (its tokens then acted as B's
principal); post invalid ids to raw-id fields and read the labels the admin renders back (any
user, any tenant's principals and applications, one id at a time); open django-oauth-toolkit's
own admin pages (every tenant's applications and tokens).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

from tenants.auth import AuthError, authenticate
from tenants.models import Principal, TenantApplication
from tenants.roles import TENANT_ADMIN_GROUP
from tenants.services import (
    add_member,
    create_client_application,
    get_or_create_principal,
    grant_operator_role,
    issue_token,
)
from tests.support.admin_forms import operator_client, post_form
from tests.support.oauth import RESOURCE

pytestmark = pytest.mark.django_db

#: Words only tenant B's rows contain: none may appear on a page tenant A's admin gets.
B_WORDS = ("Globex payroll bot", "secret-bot-b", "ceo-of-b", "tenant-b:payroll")


@pytest.fixture
def world(tenant_a: Any, tenant_b: Any) -> dict[str, Any]:
    user_model = get_user_model()
    alice = user_model.objects.create_user(username="alice", password="pw-alice-123")
    grant_operator_role(user=alice, tenant=tenant_a, role="admin")
    ceo = user_model.objects.create_user(username="ceo-of-b", password="pw-ceo-123")
    add_member(tenant=tenant_b, user=ceo)
    link_a, _ = create_client_application(tenant=tenant_a, principal_name="robot-a")
    link_b, _ = create_client_application(tenant=tenant_b, principal_name="payroll")
    bot_b = get_or_create_principal(tenant=tenant_b, kind=Principal.Kind.CLIENT, identifier="secret-bot-b",
                                    name="Globex payroll bot")
    return {"alice": operator_client("alice", "pw-alice-123"), "link_a": link_a, "link_b": link_b,
            "bot_b": bot_b, "ceo": ceo, "a": tenant_a, "b": tenant_b}


def _no_b(page: str) -> None:
    leaked = [w for w in B_WORDS if w in page]
    assert not leaked, leaked


def test_the_application_inline_cannot_bind_another_tenants_principal(world: dict[str, Any]) -> None:
    url = f"/admin/tenants/tenant/{world['a'].pk}/change/"
    response = post_form(world["alice"], url, **{"applications-0-principal": world["bot_b"].pk})
    assert response.status_code == 200  # the page again, with the error
    _no_b(response.content.decode())
    world["link_a"].refresh_from_db()
    assert world["link_a"].principal_id != world["bot_b"].pk


def test_raw_id_fields_never_render_another_tenants_labels(world: dict[str, Any]) -> None:
    url = f"/admin/tenants/tenant/{world['a'].pk}/change/"
    # An invalid limit makes the page render again with every posted id in its widget.
    response = post_form(world["alice"], url, max_concurrent_tasks="-1", **{
        "applications-0-principal": world["bot_b"].pk, "memberships-0-user": world["ceo"].pk})
    assert response.status_code == 200
    _no_b(response.content.decode())
    link_url = f"/admin/tenants/tenantapplication/{world['link_a'].pk}/change/"
    response = post_form(world["alice"], link_url, allowed_scopes="", application=world["link_b"].application_id,
                         principal=world["bot_b"].pk)
    assert response.status_code == 200
    _no_b(response.content.decode())
    world["link_a"].refresh_from_db()
    assert world["link_a"].application_id != world["link_b"].application_id
    assert TenantApplication.objects.get(pk=world["link_b"].pk).tenant_id == world["b"].pk


def test_dot_admin_pages_are_operator_only(world: dict[str, Any]) -> None:
    # Even if an operator gives the tenant-admin group django-oauth-toolkit's permissions.
    group = Group.objects.get(name=TENANT_ADMIN_GROUP)
    group.permissions.add(*Permission.objects.filter(content_type__app_label="oauth2_provider"))
    issue_token(tenant=world["b"], principal_name="payroll")
    for model in ("application", "accesstoken", "grant", "refreshtoken", "idtoken"):
        response = world["alice"].get(f"/admin/oauth2_provider/{model}/")
        assert response.status_code == 403, model
    response = world["alice"].get(f"/admin/oauth2_provider/application/{world['link_b'].application_id}/change/")
    assert response.status_code in (302, 403)
    _no_b(response.content.decode())


def test_a_link_to_another_tenants_principal_is_refused_at_run_time(world: dict[str, Any]) -> None:
    token = issue_token(tenant=world["a"], principal_name="robot-a")  # link_a's application
    assert authenticate(headers={"authorization": f"Bearer {token}"}, query_string="",
                        resource_url=RESOURCE).tenant_id == world["a"].pk
    # Written before this fix (or by a raw write): the token must not act as B's principal.
    TenantApplication.objects.filter(pk=world["link_a"].pk).update(principal=world["bot_b"])
    from tenants.auth_cache import cache as auth_cache

    auth_cache.clear()
    with pytest.raises(AuthError) as info:
        authenticate(headers={"authorization": f"Bearer {token}"}, query_string="", resource_url=RESOURCE)
    assert info.value.status == 401
