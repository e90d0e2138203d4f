"""Item 10: an external issuer's shared secret is encrypted at rest and never displayed."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client

from tenants.auth import authenticate
from tenants.models import ExternalIssuer
from tests.support.oauth import ISSUER, RESOURCE, jwt_claims

pytestmark = pytest.mark.django_db

SECRET = "hs256-shared-secret-" + "s" * 24


def _raw_secret(pk: int) -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT shared_secret FROM tenants_externalissuer WHERE id = %s", [pk])
        return str(cur.fetchone()[0])


def _issuer(tenant: Any) -> ExternalIssuer:
    return ExternalIssuer.objects.create(tenant=tenant, issuer=ISSUER, shared_secret=SECRET, algorithms="HS256",
                                         audience=RESOURCE)


def test_secret_is_encrypted_in_the_database_and_still_verifies(tenant_a: Any) -> None:
    import jwt

    row = _issuer(tenant_a)
    raw = _raw_secret(row.pk)
    assert SECRET not in raw and raw.startswith("enc1:")
    assert ExternalIssuer.objects.get(pk=row.pk).shared_secret == SECRET
    token = jwt.encode(jwt_claims(aud=RESOURCE), SECRET, algorithm="HS256")
    ctx = authenticate(headers={"authorization": f"Bearer {token}"}, query_string="", resource_url=RESOURCE)
    assert ctx.tenant_id == tenant_a.pk


def test_admin_never_shows_the_secret_and_keeps_it_when_left_blank(tenant_a: Any, admin_user: Any) -> None:
    row = _issuer(tenant_a)
    browser = Client()
    browser.force_login(admin_user)
    url = f"/admin/tenants/externalissuer/{row.pk}/change/"
    page = browser.get(url)
    assert page.status_code == 200
    assert SECRET not in page.content.decode() and _raw_secret(row.pk) not in page.content.decode()
    form = {
        "tenant": tenant_a.pk, "name": "edited", "active": "on", "issuer": ISSUER, "jwks_url": "",
        "static_keys": "null", "shared_secret": "", "audience": RESOURCE, "tenant_claim": "",
        "tenant_claim_value": "", "principal_claim": "sub", "scopes_claim": "scope", "algorithms": "HS256",
        "leeway_s": "30",
    }
    response = browser.post(url, form)
    assert response.status_code == 302, response.content.decode()[:3000]
    row.refresh_from_db()
    assert row.name == "edited" and row.shared_secret == SECRET
