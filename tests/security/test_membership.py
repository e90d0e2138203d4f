"""Item 2: users act only in tenants they are members of; sign-in is throttled; passwords checked."""

from __future__ import annotations

import base64
import hashlib
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone
from oauth2_provider.models import get_access_token_model, set_token_value

from mcptasks.models import AuditEvent
from tenants.auth import AuthError, authenticate
from tenants.services import add_member, create_authorization_code_application

pytestmark = pytest.mark.django_db

REDIRECT = "http://127.0.0.1:33418/callback"
RESOURCE = "http://testserver/mcp"


def _authorize_params(client_id: str) -> dict[str, str]:
    challenge = base64.urlsafe_b64encode(hashlib.sha256(b"v" * 64).digest()).rstrip(b"=").decode()
    return {"response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT,
            "scope": "mcp:tools mcp:tasks", "code_challenge": challenge, "code_challenge_method": "S256",
            "state": "s"}


def test_non_member_gets_an_error_page_not_a_code(tenant_a: Any, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user(username="mallory", password="x-long-passphrase-1")
    link, _ = create_authorization_code_application(tenant=tenant_a, name="desktop", redirect_uris=[REDIRECT])
    browser = Client()
    browser.force_login(user)
    params = _authorize_params(link.application.client_id)
    assert browser.get("/o/authorize/", params).status_code == 403
    response = browser.post("/o/authorize/", {**params, "allow": "Authorize"})
    assert response.status_code == 403
    assert "code=" not in response.get("Location", "")
    assert AuditEvent.objects.filter(action="oauth.not_member", tenant_id=tenant_a.pk).count() == 2


def test_member_of_another_tenant_is_still_refused(tenant_a: Any, tenant_b: Any, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user(username="bob", password="x-long-passphrase-1")
    add_member(tenant=tenant_b, user=user)
    link, _ = create_authorization_code_application(tenant=tenant_a, name="desktop", redirect_uris=[REDIRECT])
    browser = Client()
    browser.force_login(user)
    assert browser.get("/o/authorize/", _authorize_params(link.application.client_id)).status_code == 403


def test_member_gets_the_consent_page(tenant_a: Any, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user(username="alice", password="x-long-passphrase-1")
    add_member(tenant=tenant_a, user=user)
    link, _ = create_authorization_code_application(tenant=tenant_a, name="desktop", redirect_uris=[REDIRECT])
    browser = Client()
    browser.force_login(user)
    response = browser.post("/o/authorize/", {**_authorize_params(link.application.client_id), "allow": "Authorize"})
    assert response.status_code == 302 and "code=" in response["Location"]


def test_user_token_is_refused_once_membership_is_gone(tenant_a: Any, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user(username="carol", password="x-long-passphrase-1")
    membership = add_member(tenant=tenant_a, user=user)
    link, _ = create_authorization_code_application(tenant=tenant_a, name="desktop", redirect_uris=[REDIRECT])
    access = get_access_token_model()(
        application=link.application, user=user, expires=timezone.now() + timedelta(hours=1),
        scope="mcp:tools mcp:tasks", resource=[],
    )
    set_token_value(access, "usertok-" + "y" * 40)
    access.save()
    headers = {"authorization": "Bearer usertok-" + "y" * 40}
    assert authenticate(headers=headers, query_string="", resource_url=RESOURCE).tenant_id == tenant_a.pk
    membership.delete()
    with pytest.raises(AuthError) as info:
        authenticate(headers=headers, query_string="", resource_url=RESOURCE)
    assert info.value.status == 401


def test_sign_in_waits_per_username_and_address(settings: Any, django_user_model: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "LOGIN_FREE_FAILURES": 3}
    django_user_model.objects.create_user(username="dave", password="x-long-passphrase-1")
    for _ in range(3):
        assert Client().post("/accounts/login/", {"username": "dave", "password": "wrong"}).status_code == 200
    # From this address even the right password waits now: checked before the password.
    response = Client().post("/accounts/login/", {"username": "dave", "password": "x-long-passphrase-1"})
    assert response.status_code == 429 and int(response["Retry-After"]) > 0
    assert AuditEvent.objects.filter(action="login.throttled").exists()
    # Never a lockout: from another address the account's owner signs in.
    assert Client(REMOTE_ADDR="198.51.100.30").post(
        "/accounts/login/", {"username": "dave", "password": "x-long-passphrase-1"}).status_code == 302


def test_sign_in_is_throttled_per_address(settings: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "LOGIN_MAX_FAILURES_PER_IP": 4}
    for i in range(4):
        Client(REMOTE_ADDR="198.51.100.7").post("/accounts/login/", {"username": f"u{i}", "password": "wrong"})
    assert Client(REMOTE_ADDR="198.51.100.7").post(
        "/accounts/login/", {"username": "fresh", "password": "wrong"}
    ).status_code == 429
    assert Client(REMOTE_ADDR="198.51.100.8").post(
        "/accounts/login/", {"username": "fresh", "password": "wrong"}
    ).status_code == 200


def test_password_validators_are_on() -> None:
    with pytest.raises(ValidationError):
        validate_password("12345678")


def test_admin_sign_in_and_api_basic_credentials_share_the_failure_budget(settings: Any,
                                                                          django_user_model: Any) -> None:
    import base64
    import uuid

    settings.TENANTS = {**settings.TENANTS, "LOGIN_FREE_FAILURES": 3}
    name = f"ops-{uuid.uuid4().hex[:8]}"
    django_user_model.objects.create_superuser(username=name, password="x-long-passphrase-2", email="")

    def basic(password: str) -> dict[str, str]:
        return {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}

    # Two wrong passwords on the admin's sign-in, one through the API: the free failures are spent.
    for _ in range(2):
        response = Client().post("/admin/login/", {"username": name, "password": "wrong"})
        assert response.status_code == 200
    assert Client().get("/api/tenants/x/tasks/", **basic("wrong")).status_code in (401, 403)
    # Now even the right password waits, on every way in (from this address).
    assert Client().get("/api/tenants/x/tasks/", **basic("x-long-passphrase-2")).status_code == 429
    refused = Client().post("/admin/login/", {"username": name, "password": "x-long-passphrase-2"})
    assert refused.status_code == 429
    assert Client().post("/accounts/login/", {"username": name, "password": "x-long-passphrase-2"}).status_code == 429
