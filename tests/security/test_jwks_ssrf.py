"""Issue 25 item 4: JWKS URLs cannot make the server call internal addresses (SSRF).

The attack: a tenant admin set ``jwks_url`` to a loopback ``http://`` URL (or any host); any
unauthenticated request naming that issuer made the server fetch it (a local listener got
``GET /internal/admin/...``), and the error text told whether the target answered with keys.
Now only operators set ``jwks_url``; every outbound call refuses loopback, private, link-local
and metadata addresses, checked on the resolved address the connection then uses, unless
``MCPTASKS_OUTBOUND_ALLOWED_NETWORKS`` allows them; and the public error is one sentence.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from tenants import outbound
from tenants.auth import AuthError, authenticate
from tenants.jwt_issuers import JwksUnavailable, aprefetch, fetch_jwks
from tenants.models import ExternalIssuer
from tenants.services import grant_operator_role
from tests.support.admin_forms import form_fields, operator_client, post_form
from tests.support.oauth import ISSUER, RESOURCE, JwksServer, KeyPair, jwt_claims

pytestmark = pytest.mark.django_db

AT_A = RESOURCE + "/t/tenant-a"


@pytest.fixture
def listener() -> Iterator[JwksServer]:
    """An internal service on loopback (it happens to answer with a JWKS document)."""
    server = JwksServer()
    yield server
    server.close()


@pytest.fixture
def admin_of_a(tenant_a: Any) -> Any:
    user = get_user_model().objects.create_user(username="alice", password="pw-alice-123")
    grant_operator_role(user=user, tenant=tenant_a, role="admin")
    return operator_client("alice", "pw-alice-123")


def _allow(settings: Any, *networks: str) -> None:
    settings.TENANTS = {**settings.TENANTS, "OUTBOUND_ALLOWED_NETWORKS": tuple(networks)}


def _public_error(token: str) -> str:
    asyncio.run(aprefetch(token))
    with pytest.raises(AuthError) as info:
        authenticate(headers={"authorization": f"Bearer {token}"}, query_string="", resource_url=AT_A)
    assert info.value.status == 401
    return info.value.message


def test_a_tenant_admin_cannot_set_a_jwks_url(tenant_a: Any, admin_of_a: Any, listener: JwksServer) -> None:
    key = KeyPair("k-a")
    url = "/admin/tenants/externalissuer/add/"
    assert "jwks_url" not in form_fields(admin_of_a, url)
    response = post_form(admin_of_a, url, tenant=tenant_a.pk, issuer=ISSUER, jwks_url=listener.url + "?x",
                         static_keys=json.dumps({"keys": [key.jwk]}), principal_claim="sub", scopes_claim="scope",
                         algorithms="RS256", leeway_s="30", active="on")
    assert response.status_code == 302, response.content.decode()[:3000]
    row = ExternalIssuer.objects.get(tenant=tenant_a)
    assert row.jwks_url == ""  # the forged field was ignored
    change = f"/admin/tenants/externalissuer/{row.pk}/change/"
    response = post_form(admin_of_a, change, jwks_url=listener.url)
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.jwks_url == ""
    assert listener.hits == 0


def test_model_validation_refuses_internal_literal_addresses(tenant_a: Any, settings: Any) -> None:
    for url in ("http://127.0.0.1:9/keys", "https://10.0.0.5/keys", "https://169.254.169.254/latest/",
                "https://[::1]/keys", "https://localhost/keys", "https://[::ffff:127.0.0.1]/k"):
        row = ExternalIssuer(tenant=tenant_a, issuer=ISSUER, jwks_url=url)
        with pytest.raises(Exception, match="not allowed"):
            row.full_clean()
    _allow(settings, "127.0.0.0/8")
    ExternalIssuer(tenant=tenant_a, issuer=ISSUER, jwks_url="http://127.0.0.1:9/keys").full_clean()


# The prefetch reads the issuer on another connection (a thread): SQLite's in-memory test
# database refuses that while this test's transaction holds the table, so commit instead.
@pytest.mark.django_db(transaction=True)
def test_an_unauthenticated_token_never_makes_the_server_call_loopback(
    tenant_a: Any, listener: JwksServer
) -> None:
    # An operator's row (or one saved before this fix) pointing at an internal service.
    ExternalIssuer.objects.create(tenant=tenant_a, issuer=ISSUER, jwks_url=listener.url + "/internal/admin")
    token = KeyPair("k1").sign(jwt_claims(aud=AT_A, org="tenant-a"))
    _public_error(token)
    with pytest.raises(JwksUnavailable):
        fetch_jwks(listener.url)
    assert listener.hits == 0


def test_a_name_resolving_to_an_internal_address_is_refused_at_connect_time(
    settings: Any, listener: JwksServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.TENANTS = {**settings.TENANTS, "JWKS_ALLOW_HTTP": True}
    port = listener.server.server_address[1]
    real = socket.getaddrinfo
    calls: list[str] = []

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "idp.rebind.test":
            calls.append(host)
            return real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    with pytest.raises(JwksUnavailable):
        fetch_jwks(f"http://idp.rebind.test:{port}/jwks.json")
    assert listener.hits == 0 and calls
    # Allowed by the operator: the same name works, connecting to the address that was checked.
    _allow(settings, "127.0.0.0/8")
    calls.clear()
    assert fetch_jwks(f"http://idp.rebind.test:{port}/jwks.json") == {"keys": []}
    assert listener.hits == 1 and len(calls) == 1  # resolved once: the checked address is the one used


# The prefetch reads the issuer on another connection (a thread): SQLite's in-memory test
# database refuses that while this test's transaction holds the table, so commit instead.
@pytest.mark.django_db(transaction=True)
def test_the_public_error_is_the_same_whatever_the_target_returned(
    tenant_a: Any, settings: Any, listener: JwksServer
) -> None:
    _allow(settings, "127.0.0.0/8")
    signer = KeyPair("k1")
    messages = set()
    targets = {"keys without ours": listener.url, "not JSON": listener.url,
               "nobody listening": "http://127.0.0.1:9/keys"}
    for label, url in targets.items():
        ExternalIssuer.objects.all().delete()
        listener.keys = [KeyPair("other").jwk] if label == "keys without ours" else []
        from django.core.cache import cache

        cache.clear()
        ExternalIssuer.objects.create(tenant=tenant_a, issuer=ISSUER, jwks_url=url)
        messages.add(_public_error(signer.sign(jwt_claims(aud=AT_A, org="tenant-a"))))
    assert len(messages) == 1, messages


def test_the_policy_refuses_internal_addresses_unless_allowed(settings: Any) -> None:
    for address in ("127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "0.0.0.0", "::1",
                    "fe80::1", "fd00:ec2::254", "::ffff:127.0.0.1", "100.100.100.200", "224.0.0.1"):
        assert not outbound.is_allowed(address), address
    assert outbound.is_allowed("93.184.216.34")
    _allow(settings, "10.0.0.0/8", "::1/128")
    assert outbound.is_allowed("10.1.2.3") and outbound.is_allowed("::1")
    assert not outbound.is_allowed("192.168.1.1")
