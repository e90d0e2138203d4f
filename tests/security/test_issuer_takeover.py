"""Issue 25 item 1: a tenant admin cannot take over another tenant's identity provider.

The attack: tenant B trusts a shared identity provider (tenant claim ``org`` = ``tenant-b``,
audience B's endpoint). A tenant admin of A saves a copy of B's row in A (same issuer, same
claim and value, audience B's endpoint): B's users' tokens then landed in tenant A at ``/mcp/t/A``
and ``/mcp``. Now the admin refuses it (shared issuers are operator-only, a tenant admin's
audience is its own endpoint or blank), model validation refuses overlapping rows for everyone,
a system check reports existing ones, and verification never picks one tenant of several.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.checks import run_checks
from django.core.exceptions import ValidationError

from tenants.auth import AuthError, authenticate
from tenants.models import ExternalIssuer
from tenants.services import grant_operator_role
from tests.support.admin_forms import form_fields, operator_client, post_form
from tests.support.oauth import ISSUER, RESOURCE, KeyPair, jwt_claims

pytestmark = pytest.mark.django_db

SHARED = RESOURCE
AT_A = SHARED + "/t/tenant-a"
AT_B = SHARED + "/t/tenant-b"
ADD_URL = "/admin/tenants/externalissuer/add/"


@pytest.fixture(scope="module")
def idp_key() -> KeyPair:
    return KeyPair("idp-1")


@pytest.fixture
def b_trusts_the_idp(tenant_b: Any, idp_key: KeyPair) -> ExternalIssuer:
    return ExternalIssuer.objects.create(
        tenant=tenant_b, issuer=ISSUER, static_keys={"keys": [idp_key.jwk]}, tenant_claim="org",
        tenant_claim_value="tenant-b", audience=AT_B,
    )


@pytest.fixture
def admin_of_a(tenant_a: Any) -> Any:
    user = get_user_model().objects.create_user(username="alice", password="pw-alice-123")
    grant_operator_role(user=user, tenant=tenant_a, role="admin")
    return operator_client("alice", "pw-alice-123")


def _copy_of_b(tenant: Any, key: KeyPair, **kw: Any) -> dict[str, Any]:
    return {"tenant": tenant.pk, "name": "copy", "active": "on", "issuer": ISSUER,
            "static_keys": json.dumps({"keys": [key.jwk]}), "audience": AT_B,
            "tenant_claim": "org", "tenant_claim_value": "tenant-b", "principal_claim": "sub",
            "scopes_claim": "scope", "algorithms": "RS256", "leeway_s": "30", **kw}


def _auth(token: str, at: str) -> Any:
    return authenticate(headers={"authorization": f"Bearer {token}"}, query_string="", resource_url=at)


def test_a_tenant_admin_cannot_save_a_copy_of_another_tenants_issuer(
    tenant_a: Any, b_trusts_the_idp: ExternalIssuer, admin_of_a: Any, idp_key: KeyPair
) -> None:
    response = post_form(admin_of_a, ADD_URL, **_copy_of_b(tenant_a, idp_key))
    assert response.status_code == 200  # the form again, with its errors
    assert not ExternalIssuer.objects.filter(tenant=tenant_a).exists()
    page = response.content.decode()
    errors = re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', page, re.S)
    assert errors and "Only an operator can add or change this issuer" in "".join(errors)
    assert not any("tenant-b" in e for e in errors)  # B is never named back


def test_a_tenant_admin_sets_only_its_own_endpoint_as_audience(
    tenant_a: Any, admin_of_a: Any, idp_key: KeyPair
) -> None:
    other_idp = "https://own-idp.example.test/"
    for audience in (AT_B, SHARED, "api://anything"):
        response = post_form(admin_of_a, ADD_URL, **_copy_of_b(
            tenant_a, idp_key, issuer=other_idp, audience=audience, tenant_claim="", tenant_claim_value=""))
        assert response.status_code == 200, audience
        assert not ExternalIssuer.objects.filter(tenant=tenant_a).exists(), audience
    for audience in (AT_A, ""):
        response = post_form(admin_of_a, ADD_URL, **_copy_of_b(
            tenant_a, idp_key, issuer=other_idp, audience=audience, tenant_claim="", tenant_claim_value=""))
        assert response.status_code == 302, response.content.decode()[:3000]
        assert ExternalIssuer.objects.filter(tenant=tenant_a, audience=audience).exists()
        ExternalIssuer.objects.filter(tenant=tenant_a).delete()


def test_rows_of_a_shared_issuer_are_operator_only(
    tenant_a: Any, tenant_b: Any, b_trusts_the_idp: ExternalIssuer, admin_of_a: Any, idp_key: KeyPair
) -> None:
    # An operator made A trust the same provider (distinct claim value): A's admin may read it, not change it.
    mine = ExternalIssuer.objects.create(
        tenant=tenant_a, issuer=ISSUER, static_keys={"keys": [idp_key.jwk]}, tenant_claim="org",
        tenant_claim_value="tenant-a")
    url = f"/admin/tenants/externalissuer/{mine.pk}/change/"
    fields = form_fields(admin_of_a, url)
    assert "tenant_claim_value" not in fields  # shown read-only
    data = {**fields, "tenant_claim_value": "tenant-b", "audience": AT_B}
    response = admin_of_a.post(url, data)
    assert response.status_code == 403
    mine.refresh_from_db()
    assert (mine.tenant_claim_value, mine.audience) == ("tenant-a", "")


def test_model_validation_refuses_rows_that_verify_the_same_token(
    tenant_a: Any, b_trusts_the_idp: ExternalIssuer, idp_key: KeyPair
) -> None:
    copy = ExternalIssuer(tenant=tenant_a, issuer=ISSUER, static_keys={"keys": [idp_key.jwk]}, tenant_claim="org",
                          tenant_claim_value="tenant-b", audience=AT_B)
    with pytest.raises(ValidationError):
        copy.full_clean()
    # Another claim name overlaps too: one token may carry both claims.
    other_claim = ExternalIssuer(tenant=tenant_a, issuer=ISSUER, static_keys={"keys": [idp_key.jwk]},
                                 tenant_claim="team", tenant_claim_value="x", audience=AT_B)
    with pytest.raises(ValidationError):
        other_claim.full_clean()
    # A's own endpoint as audience, or its own claim value, does not overlap.
    ExternalIssuer(tenant=tenant_a, issuer=ISSUER, static_keys={"keys": [idp_key.jwk]}, tenant_claim="org",
                   tenant_claim_value="tenant-a", audience=AT_B).full_clean()
    ExternalIssuer(tenant=tenant_a, issuer=ISSUER, static_keys={"keys": [idp_key.jwk]}, tenant_claim="org",
                   tenant_claim_value="tenant-b").full_clean()


def test_system_check_reports_existing_overlapping_rows(
    tenant_a: Any, b_trusts_the_idp: ExternalIssuer, idp_key: KeyPair
) -> None:
    assert not [m for m in run_checks(include_deployment_checks=False, databases=["default"])
                if m.id == "tenants.E003"]
    ExternalIssuer.objects.create(tenant=tenant_a, issuer=ISSUER, static_keys={"keys": [idp_key.jwk]},
                                  tenant_claim="org", tenant_claim_value="tenant-b", audience=AT_B)
    found = [m for m in run_checks(databases=["default"]) if m.id == "tenants.E003"]
    assert len(found) == 1 and ISSUER in found[0].msg


def test_a_token_that_verifies_for_two_tenants_enters_neither(
    tenant_a: Any, tenant_b: Any, b_trusts_the_idp: ExternalIssuer, idp_key: KeyPair
) -> None:
    token_of_b = idp_key.sign(jwt_claims(aud=AT_B, org="tenant-b"))
    assert _auth(token_of_b, AT_B).tenant_id == tenant_b.pk
    # The copy exists (saved before validation existed, or by a raw write).
    ExternalIssuer.objects.create(tenant=tenant_a, issuer=ISSUER, static_keys={"keys": [idp_key.jwk]},
                                  tenant_claim="org", tenant_claim_value="tenant-b", audience=AT_B)
    for at in (AT_A, SHARED, AT_B):
        with pytest.raises(AuthError) as info:
            _auth(token_of_b, at)
        assert info.value.status == 401, at
