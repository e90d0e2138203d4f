"""Webhooks in the console: a tenant admin manages only their tenant's endpoints and deliveries.

Driven over HTTP through the real admin (CSRF enforced, forms read from the page, forged POSTs).
The signing secret appears once, on the page that answers the creation (not cached), is stored
encrypted, and never reaches the audit log.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from mcptasks.models import AuditEvent, TaskStatus, WebhookDelivery
from mcptasks.tasks import transitions
from tenants.models import Principal, WebhookEndpoint
from tenants.services import add_webhook_endpoint, grant_operator_role
from tests.support.admin_forms import form_fields, operator_client
from tests.support.factories import make_auth, make_task

ADD = "/admin/tenants/webhookendpoint/add/"
DELIVERIES = "/admin/mcptasks/webhookdelivery/"


@pytest.fixture
def admin_of_a(tenant_a: Any) -> Any:
    user = get_user_model().objects.create_user(username="alice", password="pw-alice-123")
    grant_operator_role(user=user, tenant=tenant_a, role="admin")
    return operator_client("alice", "pw-alice-123")


def _add(browser: Any, **forged: Any) -> Any:
    data: dict[str, Any] = form_fields(browser, ADD)
    data.update({"url": "https://hooks.example.com/a", "events": ["task.completed", "task.failed"]})
    data.update(forged)
    return browser.post(ADD, {k: v for k, v in data.items() if v is not None})


def test_a_tenant_admin_adds_an_endpoint_and_sees_its_secret_once(tenant_a: Any, admin_of_a: Any) -> None:
    response = _add(admin_of_a, tenant=tenant_a.pk)
    assert response.status_code == 200
    endpoint = WebhookEndpoint.objects.get()
    page = response.content.decode()
    assert endpoint.tenant_id == tenant_a.pk and endpoint.events == ["task.completed", "task.failed"]
    assert re.search(r"whsec_[A-Za-z0-9+/=]+", page).group(0) == endpoint.secret  # type: ignore[union-attr]
    assert "no-store" in response["Cache-Control"]
    # Never again: not on the change page, not in the audit trail.
    change = admin_of_a.get(f"/admin/tenants/webhookendpoint/{endpoint.pk}/change/").content.decode()
    assert endpoint.secret not in change
    assert not any(endpoint.secret in str(e.data) for e in AuditEvent.objects.all())
    assert AuditEvent.objects.filter(action="admin.add", tenant_id=tenant_a.pk).exists()


def test_forged_tenant_principal_and_address_are_refused(tenant_a: Any, tenant_b: Any, admin_of_a: Any,
                                                        settings: Any) -> None:
    other = Principal.objects.create(tenant=tenant_b, kind=Principal.Kind.CLIENT, identifier="bob")
    for forged in ({"tenant": tenant_b.pk}, {"tenant": tenant_a.pk, "principal": other.pk},
                   {"tenant": tenant_a.pk, "url": "http://169.254.169.254/latest/meta-data"},
                   {"tenant": tenant_a.pk, "events": ["task.everything"]}):
        response = _add(admin_of_a, **forged)
        assert response.status_code == 200
        assert "errornote" in response.content.decode(), forged
        assert "bob" not in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_another_tenants_endpoints_and_deliveries_are_invisible(tenant_a: Any, tenant_b: Any,
                                                                admin_of_a: Any) -> None:
    theirs = add_webhook_endpoint(tenant=tenant_b, url="https://b.example.com/secret-path")
    mine = add_webhook_endpoint(tenant=tenant_a, url="https://a.example.com/h",
                                events=["task.completed"])
    auth_a, auth_b = make_auth(tenant=tenant_a), make_auth(tenant=tenant_b)
    transitions.transition(task=make_task(auth_a), to=TaskStatus.COMPLETED, result={"content": []})
    theirs.events = ["task.completed"]
    theirs.save()
    transitions.transition(task=make_task(auth_b), to=TaskStatus.COMPLETED, result={"content": []})
    listing = admin_of_a.get("/admin/tenants/webhookendpoint/").content.decode()
    assert "a.example.com" in listing and "b.example.com" not in listing
    assert admin_of_a.get(f"/admin/tenants/webhookendpoint/{theirs.pk}/change/").status_code in (302, 404)
    deliveries = admin_of_a.get(DELIVERIES).content.decode()
    mine_row = WebhookDelivery.objects.get(endpoint=mine)
    their_row = WebhookDelivery.objects.get(endpoint=theirs)
    assert mine_row.task_id in deliveries and their_row.task_id not in deliveries
    # Redeliver: a forged selection of the other tenant's delivery changes nothing.
    WebhookDelivery.objects.update(state=WebhookDelivery.State.FAILED, attempts=3)
    token = admin_of_a.get(DELIVERIES).cookies.get("csrftoken") or admin_of_a.cookies["csrftoken"]
    response = admin_of_a.post(DELIVERIES, {"action": "redeliver", "_selected_action": [mine_row.pk, their_row.pk],
                                            "csrfmiddlewaretoken": token.value})
    assert response.status_code == 302
    assert WebhookDelivery.objects.get(pk=mine_row.pk).state == WebhookDelivery.State.PENDING
    assert WebhookDelivery.objects.get(pk=their_row.pk).state == WebhookDelivery.State.FAILED
    redone = AuditEvent.objects.filter(action="webhook.redeliver")
    assert [e.tenant_id for e in redone] == [tenant_a.pk]
    assert redone[0].data["operator"] == "alice"


def test_rotation_in_the_console_keeps_the_old_secret_for_the_overlap(tenant_a: Any, tenant_b: Any,
                                                                      admin_of_a: Any) -> None:
    mine = add_webhook_endpoint(tenant=tenant_a, url="https://a.example.com/h")
    theirs = add_webhook_endpoint(tenant=tenant_b, url="https://b.example.com/h")
    old_mine, old_theirs = mine.secret, theirs.secret
    token = admin_of_a.get("/admin/tenants/webhookendpoint/").cookies["csrftoken"].value
    response = admin_of_a.post("/admin/tenants/webhookendpoint/", {
        "action": "rotate_secrets", "_selected_action": [mine.pk, theirs.pk], "csrfmiddlewaretoken": token})
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.secret != old_mine and mine.previous_secret == old_mine
    assert mine.secret in response.content.decode()
    assert theirs.secret == old_theirs and not theirs.previous_secret
