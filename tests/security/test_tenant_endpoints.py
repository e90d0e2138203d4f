"""Item 3: the audience is per tenant by default.

Each tenant has its own endpoint, ``/mcp/t/<slug>``, a resource of its own (RFC 8707): it is the
default audience of tokens from the tenant's identity providers. A token one provider issued
for tenant B names B's endpoint, so no claim mix-up at the provider can get it into tenant A.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tenants.auth import AuthError, authenticate
from tenants.models import ExternalIssuer
from tenants.services import create_client_application, issue_token
from tests.support.oauth import ISSUER, RESOURCE, KeyPair, jwt_claims

pytestmark = pytest.mark.django_db

SHARED = RESOURCE
AT_A = SHARED + "/t/tenant-a"
AT_B = SHARED + "/t/tenant-b"


@pytest.fixture(scope="module")
def idp_key() -> KeyPair:
    return KeyPair("idp-1")


def _trust(tenant: Any, key: KeyPair, **kw: Any) -> ExternalIssuer:
    """``tenant`` trusts the provider, with the default (blank) audience."""
    return ExternalIssuer.objects.create(tenant=tenant, issuer=ISSUER, static_keys={"keys": [key.jwk]}, **kw)


def _auth(token: str, at: str) -> Any:
    return authenticate(headers={"authorization": f"Bearer {token}"}, query_string="", resource_url=at)


def _refused(token: str, at: str) -> str:
    with pytest.raises(AuthError) as info:
        _auth(token, at)
    assert info.value.status == 401
    return info.value.message


def test_blank_audience_is_the_tenants_own_endpoint(tenant_a: Any, idp_key: KeyPair) -> None:
    _trust(tenant_a, idp_key)
    assert _auth(idp_key.sign(jwt_claims(aud=AT_A)), AT_A).tenant_id == tenant_a.pk
    # A token for the shared endpoint is not a token for this tenant (before: accepted).
    assert _refused(idp_key.sign(jwt_claims(aud=SHARED)), SHARED) == "Access token was not issued for this resource"
    assert _refused(idp_key.sign(jwt_claims(aud=SHARED)), AT_A) == "Access token was not issued for this resource"
    # And the tenant's token is used at the tenant's endpoint only.
    assert _refused(idp_key.sign(jwt_claims(aud=AT_A)), SHARED) == "Access token was not issued for this resource"


def test_a_token_for_tenant_b_never_enters_tenant_a(tenant_a: Any, tenant_b: Any, idp_key: KeyPair) -> None:
    _trust(tenant_a, idp_key, tenant_claim="org")
    _trust(tenant_b, idp_key, tenant_claim="org")
    # Even if the provider mislabels the tenant claim, B's audience keeps it out of A.
    for_b_claiming_a = idp_key.sign(jwt_claims(aud=AT_B, org="tenant-a"))
    _refused(for_b_claiming_a, AT_A)
    _refused(for_b_claiming_a, SHARED)
    _refused(for_b_claiming_a, AT_B)  # and B's own endpoint checks the claim too
    assert _auth(idp_key.sign(jwt_claims(aud=AT_B, org="tenant-b")), AT_B).tenant_id == tenant_b.pk
    assert _auth(idp_key.sign(jwt_claims(aud=AT_A, org="tenant-a")), AT_A).tenant_id == tenant_a.pk


def test_an_explicit_shared_audience_still_needs_the_tenant_claim(
    tenant_a: Any, tenant_b: Any, idp_key: KeyPair
) -> None:
    _trust(tenant_a, idp_key, tenant_claim="org", audience="api://shared")
    _trust(tenant_b, idp_key, tenant_claim="org", audience="api://shared")
    token_for_b = idp_key.sign(jwt_claims(aud="api://shared", org="tenant-b"))
    assert _auth(token_for_b, SHARED).tenant_id == tenant_b.pk
    # At A's endpoint only A's issuer rows are candidates.
    assert _refused(token_for_b, AT_A) == "Access token is not for this tenant"


def test_built_in_tokens_work_only_at_their_own_tenants_endpoint(tenant_a: Any, tenant_b: Any) -> None:
    token = issue_token(tenant=tenant_a, principal_name="bot", resource=SHARED)
    assert _auth(token, SHARED).tenant_id == tenant_a.pk
    assert _auth(token, AT_A).tenant_id == tenant_a.pk
    assert _refused(token, AT_B) == "Access token is not for this tenant"
    bound = issue_token(tenant=tenant_a, principal_name="bot", resource=AT_A)
    assert _auth(bound, AT_A).tenant_id == tenant_a.pk
    assert _refused(bound, SHARED) == "Access token was not issued for this resource"


def test_token_endpoint_issues_tokens_for_a_tenants_endpoint(tenant_a: Any, settings: Any) -> None:
    settings.ROOT_URLCONF = "tenants.urls"
    link, secret = create_client_application(tenant=tenant_a, principal_name="ci-bot")
    form = {"grant_type": "client_credentials", "client_id": link.application.client_id, "client_secret": secret}
    response = Client().post("/o/token/", {**form, "resource": AT_A})
    assert response.status_code == 200, response.content
    token = response.json()["access_token"]
    assert _auth(token, AT_A).tenant_id == tenant_a.pk
    _refused(token, SHARED)
    # Anything that is neither this server's endpoint nor a tenant's endpoint is refused.
    for target in (SHARED + "/t/", SHARED + "/other", "http://elsewhere.example/mcp/t/tenant-a"):
        assert Client().post("/o/token/", {**form, "resource": target}).json()["error"] == "invalid_target"


def test_each_tenant_endpoint_has_its_own_metadata(
    tenant_a: Any, tenant_b: Any, idp_key: KeyPair, settings: Any
) -> None:
    settings.ROOT_URLCONF = "tenants.urls"
    _trust(tenant_b, idp_key)
    doc_a = Client().get("/.well-known/oauth-protected-resource/mcp/t/tenant-a").json()
    doc_b = Client().get("/.well-known/oauth-protected-resource/mcp/t/tenant-b").json()
    assert doc_a["resource"] == AT_A and doc_b["resource"] == AT_B
    # A tenant's metadata lists only its own identity providers.
    assert ISSUER in doc_b["authorization_servers"]
    assert ISSUER not in doc_a["authorization_servers"]
    assert Client().get("/.well-known/oauth-protected-resource/mcp/t/nobody").status_code == 404
    # The challenge at a tenant's endpoint points at that document.
    with pytest.raises(AuthError) as info:
        authenticate(headers={}, query_string="", resource_url=AT_A)
    assert "/.well-known/oauth-protected-resource/mcp/t/tenant-a" in info.value.headers["WWW-Authenticate"]
