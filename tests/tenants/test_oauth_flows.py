"""The built-in authorization server end to end, and the discovery documents."""

from __future__ import annotations

import base64
import hashlib
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client

from tenants.auth import AuthError, authenticate
from tenants.models import ExternalIssuer
from tenants.services import add_member, create_authorization_code_application, create_client_application

pytestmark = pytest.mark.django_db


def _auth(token: str, resource_url: str) -> Any:
    return authenticate(
        headers={"authorization": f"Bearer {token}"}, query_string="", resource_url=resource_url
    )


def test_client_credentials_round_trip(tenant: Any, resource_url: str) -> None:
    link, secret = create_client_application(tenant=tenant, principal_name="ci-bot")
    client = Client()
    response = client.post(
        "/o/token/",
        {
            "grant_type": "client_credentials",
            "client_id": link.application.client_id,
            "client_secret": secret,
            "scope": "mcp:tools mcp:tasks",
            "resource": resource_url,
        },
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["token_type"] == "Bearer" and body["scope"] == "mcp:tools mcp:tasks"
    ctx = _auth(body["access_token"], resource_url)
    assert ctx.tenant_id == tenant.pk and ctx.principal_id == link.principal_id
    # Refused for another resource (RFC 8707 audience).
    with pytest.raises(AuthError) as info:
        _auth(body["access_token"], "http://elsewhere.example/mcp")
    assert info.value.status == 401


def test_client_credentials_without_resource_is_bound_to_this_server(tenant: Any, resource_url: str) -> None:
    link, secret = create_client_application(tenant=tenant, principal_name="ci-bot")
    response = Client().post(
        "/o/token/",
        {
            "grant_type": "client_credentials",
            "client_id": link.application.client_id,
            "client_secret": secret,
        },
    )
    assert response.status_code == 200, response.content
    token = response.json()["access_token"]
    assert _auth(token, resource_url).tenant_slug == "acme"
    with pytest.raises(AuthError):
        _auth(token, "http://other.example/mcp")


def test_token_for_foreign_resource_is_not_issued(tenant: Any) -> None:
    link, secret = create_client_application(tenant=tenant, principal_name="ci-bot")
    response = Client().post(
        "/o/token/",
        {
            "grant_type": "client_credentials",
            "client_id": link.application.client_id,
            "client_secret": secret,
            "resource": "https://api.other.example/",
        },
    )
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_target"


def test_wrong_client_secret(tenant: Any) -> None:
    link, _ = create_client_application(tenant=tenant, principal_name="ci-bot")
    response = Client().post(
        "/o/token/",
        {
            "grant_type": "client_credentials",
            "client_id": link.application.client_id,
            "client_secret": "nope",
        },
    )
    assert response.status_code == 401


def test_authorization_code_with_pkce(tenant: Any, resource_url: str, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user(username="alice", password="pw")
    add_member(tenant=tenant, user=user)
    redirect = "http://127.0.0.1:33418/callback"
    link, _ = create_authorization_code_application(tenant=tenant, name="inspector", redirect_uris=[redirect])
    client_id = link.application.client_id
    verifier = "v" * 64
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    browser = Client()
    browser.force_login(user)
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect,
        "scope": "mcp:tools mcp:tasks",
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": "xyz",
        "resource": resource_url,
    }
    response = browser.post("/o/authorize/", {**params, "allow": "Authorize"})
    assert response.status_code == 302, response.content[:500]
    query = parse_qs(urlsplit(response["Location"]).query)
    assert query["state"] == ["xyz"]
    code = query["code"][0]
    token_response = Client().post(
        "/o/token/",
        {
            "grant_type": "authorization_code",
            "client_id": client_id,
            "code": code,
            "redirect_uri": redirect,
            "code_verifier": verifier,
            "resource": resource_url,
        },
    )
    assert token_response.status_code == 200, token_response.content
    ctx = _auth(token_response.json()["access_token"], resource_url)
    assert ctx.tenant_id == tenant.pk and ctx.principal_name == "alice"


def test_authorization_code_needs_pkce(tenant: Any, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user(username="bob", password="pw")
    add_member(tenant=tenant, user=user)
    redirect = "http://127.0.0.1:33418/callback"
    link, _ = create_authorization_code_application(tenant=tenant, name="x", redirect_uris=[redirect])
    browser = Client()
    browser.force_login(user)
    response = browser.get(
        "/o/authorize/",
        {"response_type": "code", "client_id": link.application.client_id, "redirect_uri": redirect},
    )
    # Without code_challenge DOT redirects back with an error (never a code).
    assert response.status_code in (302, 400)
    if response.status_code == 302:
        assert "error=" in response["Location"] and "code=" not in response["Location"]


@pytest.mark.parametrize(
    "path", ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"]
)
def test_protected_resource_metadata(path: str, external_issuer: Any) -> None:
    response = Client().get(path)
    assert response.status_code == 200
    doc = response.json()
    assert doc["resource"] == "http://testserver/mcp"
    assert doc["authorization_servers"] == ["http://testserver", external_issuer.issuer]
    assert doc["bearer_methods_supported"] == ["header"]
    assert {"mcp:tools", "mcp:tasks"} <= set(doc["scopes_supported"])


def test_protected_resource_metadata_other_path_is_404(db: None) -> None:
    assert Client().get("/.well-known/oauth-protected-resource/other").status_code == 404


def test_protected_resource_metadata_public_url(settings: Any, db: None) -> None:
    settings.TENANTS = {**settings.TENANTS, "PUBLIC_URL": "https://mcp.example.com"}
    doc = Client().get("/.well-known/oauth-protected-resource/mcp").json()
    assert doc["resource"] == "https://mcp.example.com/mcp"
    assert doc["authorization_servers"][0] == "https://mcp.example.com"


def test_inactive_issuers_not_listed(external_issuer: Any) -> None:
    ExternalIssuer.objects.update(active=False)
    doc = Client().get("/.well-known/oauth-protected-resource").json()
    assert doc["authorization_servers"] == ["http://testserver"]


def test_authorization_server_metadata(db: None) -> None:
    response = Client().get("/.well-known/oauth-authorization-server")
    assert response.status_code == 200
    doc = response.json()
    assert doc["issuer"] == "http://testserver"
    assert doc["token_endpoint"] == "http://testserver/o/token/"
    assert doc["authorization_endpoint"] == "http://testserver/o/authorize/"
    assert "client_credentials" in doc["grant_types_supported"]
    assert "authorization_code" in doc["grant_types_supported"]
    assert doc["code_challenge_methods_supported"] == ["S256"]
    assert "registration_endpoint" not in doc


def test_no_dynamic_registration_or_app_management(db: None) -> None:
    assert Client().get("/o/applications/").status_code == 404
    assert Client().post("/o/register/", {}).status_code == 404
