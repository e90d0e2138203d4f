"""Item 3: one identity provider trusted by two tenants never lets a token cross between them."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from tenants.auth import AuthError, authenticate
from tenants.models import ExternalIssuer, Principal
from tenants.services import get_or_create_principal
from tests.support.oauth import ISSUER, RESOURCE, KeyPair, jwt_claims

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def idp_key() -> KeyPair:
    return KeyPair("idp-1")


def _issuer(tenant: Any, key: KeyPair, **kw: Any) -> ExternalIssuer:
    return ExternalIssuer.objects.create(
        tenant=tenant, issuer=ISSUER, static_keys={"keys": [key.jwk]}, audience="api://shared", **kw
    )


def _auth(token: str) -> Any:
    return authenticate(headers={"authorization": f"Bearer {token}"}, query_string="", resource_url=RESOURCE)


def test_shared_issuer_without_tenant_claim_is_refused(tenant_a: Any, tenant_b: Any, idp_key: KeyPair) -> None:
    _issuer(tenant_a, idp_key)
    _issuer(tenant_b, idp_key)
    token_for_b = idp_key.sign(jwt_claims(aud="api://shared", org="tenant-b"))
    with pytest.raises(AuthError) as info:
        _auth(token_for_b)
    assert info.value.status == 401


def test_second_tenant_must_name_the_claim(tenant_a: Any, tenant_b: Any, idp_key: KeyPair) -> None:
    _issuer(tenant_a, idp_key)
    row = ExternalIssuer(tenant=tenant_b, issuer=ISSUER, static_keys={"keys": [idp_key.jwk]}, audience="api://shared")
    with pytest.raises(ValidationError):
        row.full_clean()


def test_tenant_claim_selects_exactly_one_tenant(tenant_a: Any, tenant_b: Any, idp_key: KeyPair) -> None:
    _issuer(tenant_a, idp_key, tenant_claim="org")
    _issuer(tenant_b, idp_key, tenant_claim="org")
    assert _auth(idp_key.sign(jwt_claims(aud="api://shared", org="tenant-b"))).tenant_id == tenant_b.pk
    assert _auth(idp_key.sign(jwt_claims(aud="api://shared", org="tenant-a"))).tenant_id == tenant_a.pk
    with pytest.raises(AuthError):
        _auth(idp_key.sign(jwt_claims(aud="api://shared", org="tenant-c")))


def test_principals_are_keyed_by_issuer_and_subject(tenant_a: Any, idp_key: KeyPair) -> None:
    other = KeyPair("other-1")
    _issuer(tenant_a, idp_key)
    ExternalIssuer.objects.create(
        tenant=tenant_a, issuer="https://other-idp.example.test/", static_keys={"keys": [other.jwk]},
        audience="api://shared",
    )
    local = get_or_create_principal(tenant=tenant_a, kind=Principal.Kind.USER, identifier="alice")
    first = _auth(idp_key.sign(jwt_claims(aud="api://shared", sub="alice")))
    second = _auth(other.sign(jwt_claims(iss="https://other-idp.example.test/", aud="api://shared", sub="alice")))
    assert len({local.pk, first.principal_id, second.principal_id}) == 3
