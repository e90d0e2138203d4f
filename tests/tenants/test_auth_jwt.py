"""authenticate() with JWTs of an external issuer whose JWKS is served over HTTP on localhost."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import jwt
import pytest

from tenants.auth import AuthError, authenticate
from tenants.models import ExternalIssuer, Principal
from tests.support.oauth import ISSUER, TENANT_RESOURCE, KeyPair, jwt_claims

pytestmark = pytest.mark.django_db

PRM = "http://testserver/.well-known/oauth-protected-resource/mcp/t/acme"


@pytest.fixture
def resource_url() -> str:
    """The tenant's own endpoint: where its identity provider's tokens are meant to be used."""
    return TENANT_RESOURCE


def _auth(token: str, resource_url: str) -> Any:
    return authenticate(
        headers={"authorization": f"Bearer {token}"}, query_string="", resource_url=resource_url
    )


def _refused(token: str, resource_url: str) -> AuthError:
    with pytest.raises(AuthError) as info:
        _auth(token, resource_url)
    err = info.value
    assert err.status == 401
    assert f'resource_metadata="{PRM}"' in err.headers["WWW-Authenticate"]
    assert 'error="invalid_token"' in err.headers["WWW-Authenticate"]
    return err


def test_valid_jwt(external_issuer: Any, rsa_key: KeyPair, jwks_server: Any, resource_url: str) -> None:
    ctx = _auth(rsa_key.sign(jwt_claims()), resource_url)
    assert ctx.tenant_id == external_issuer.tenant_id
    principal = Principal.objects.get(pk=ctx.principal_id)
    assert (principal.kind, principal.identifier) == (Principal.Kind.USER, "user-42")
    assert ctx.scopes == frozenset({"mcp:tools", "mcp:tasks"})
    assert ctx.credential_ref.endswith(":j-1")
    # The JWKS is cached: a second token does not fetch it again.
    _auth(rsa_key.sign(jwt_claims(jti="j-2")), resource_url)
    assert jwks_server.hits == 1


def test_scp_list_and_client_principal(external_issuer: Any, rsa_key: KeyPair, resource_url: str) -> None:
    external_issuer.scopes_claim = "scp"
    external_issuer.principal_claim = "azp"
    external_issuer.save()
    ctx = _auth(rsa_key.sign(jwt_claims(scope=None, scp=["mcp:tasks"], azp="svc-1")), resource_url)
    assert ctx.scopes == frozenset({"mcp:tasks"})
    principal = Principal.objects.get(pk=ctx.principal_id)
    assert (principal.kind, principal.identifier) == (Principal.Kind.CLIENT, "svc-1")


def test_alg_none_refused(external_issuer: Any, resource_url: str) -> None:
    def b64(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()

    token = f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(jwt_claims())}."
    # The RFC 6750 token syntax does not even admit an empty signature; with a dummy one:
    _refused(token, resource_url)
    _refused(token + "AAAA", resource_url)
    # Even when an admin lists "none", it is never accepted.
    ExternalIssuer.objects.filter(pk=external_issuer.pk).update(algorithms="none RS256")
    _refused(token + "AAAA", resource_url)


def test_hs256_needs_explicit_secret(external_issuer: Any, rsa_key: KeyPair, resource_url: str) -> None:
    # HS* is refused while no shared secret is configured, even if listed.
    external_issuer.algorithms = "RS256 HS256"
    external_issuer.save()
    token = jwt.encode(jwt_claims(), "some-secret-some-secret-some-secret!", algorithm="HS256")
    assert "algorithm" in _refused(token, resource_url).message
    external_issuer.shared_secret = "some-secret-some-secret-some-secret!"
    external_issuer.save()
    assert _auth(token, resource_url).tenant_id == external_issuer.tenant_id


def test_unknown_key_refused(external_issuer: Any, other_key: KeyPair, resource_url: str) -> None:
    _refused(other_key.sign(jwt_claims()), resource_url)


def test_unknown_kid_refetches_once(
    external_issuer: Any, rsa_key: KeyPair, jwks_server: Any, resource_url: str, settings: Any
) -> None:
    _auth(rsa_key.sign(jwt_claims()), resource_url)
    assert jwks_server.hits == 1
    new_key = KeyPair("k2")
    # Within JWKS_MIN_REFRESH_S of the last fetch: no refetch, refused.
    assert "unknown key" in _refused(new_key.sign(jwt_claims()), resource_url).message
    assert jwks_server.hits == 1
    # The issuer rotates keys; once the refresh window has passed, an unknown kid refetches.
    jwks_server.keys = [rsa_key.jwk, new_key.jwk]
    from django.core.cache import cache

    cache.delete_many([k for k in [_refresh_key(jwks_server.url)]])
    ctx = _auth(new_key.sign(jwt_claims()), resource_url)
    assert ctx.tenant_id == external_issuer.tenant_id
    assert jwks_server.hits == 2
    # Unknown kids now hit the rate limit on refreshes again.
    _refused(KeyPair("k3").sign(jwt_claims()), resource_url)
    assert jwks_server.hits == 2


def _refresh_key(url: str) -> str:
    from tenants.jwt_issuers import _cache_key

    return _cache_key(url, "refresh")


def test_expired_jwt(external_issuer: Any, rsa_key: KeyPair, resource_url: str) -> None:
    now = int(time.time())
    err = _refused(rsa_key.sign(jwt_claims(iat=now - 3600, exp=now - 600)), resource_url)
    assert "expired" in err.message


def test_not_yet_valid_jwt(external_issuer: Any, rsa_key: KeyPair, resource_url: str) -> None:
    _refused(rsa_key.sign(jwt_claims(nbf=int(time.time()) + 600)), resource_url)


def test_wrong_audience_jwt(external_issuer: Any, rsa_key: KeyPair, resource_url: str) -> None:
    err = _refused(rsa_key.sign(jwt_claims(aud="https://api.other.example/")), resource_url)
    assert "not issued for this resource" in err.message
    _refused(rsa_key.sign(jwt_claims(aud=None)), resource_url)


def test_wrong_issuer_and_tenant_claim(external_issuer: Any, rsa_key: KeyPair, resource_url: str) -> None:
    _refused(rsa_key.sign(jwt_claims(iss="https://evil.example/")), resource_url)
    assert "tenant" in _refused(rsa_key.sign(jwt_claims(org="globex")), resource_url).message
    _refused(rsa_key.sign(jwt_claims(org=None)), resource_url)


def test_explicit_audience(external_issuer: Any, rsa_key: KeyPair, resource_url: str) -> None:
    external_issuer.audience = "api://mcptasks"
    external_issuer.save()
    assert _auth(rsa_key.sign(jwt_claims(aud="api://mcptasks")), resource_url).tenant_slug == "acme"
    _refused(rsa_key.sign(jwt_claims()), resource_url)


def test_static_keys_es256(tenant: Any, resource_url: str) -> None:
    key = KeyPair("ec1", alg="ES256")
    ExternalIssuer.objects.create(tenant=tenant, issuer=ISSUER, static_keys={"keys": [key.jwk]})
    assert _auth(key.sign(jwt_claims()), resource_url).tenant_slug == "acme"


def test_inactive_issuer(external_issuer: Any, rsa_key: KeyPair, resource_url: str) -> None:
    external_issuer.active = False
    external_issuer.save()
    _refused(rsa_key.sign(jwt_claims()), resource_url)


def test_http_jwks_refused_off_loopback(tenant: Any, rsa_key: KeyPair, resource_url: str) -> None:
    ExternalIssuer.objects.create(tenant=tenant, issuer=ISSUER, jwks_url="http://jwks.example.com/keys")
    # The public answer is the one for any key failure (issue 25 item 4); the reason is the http rule.
    assert _refused(rsa_key.sign(jwt_claims()), resource_url).message == "Token signed with an unknown key"
    from tenants.jwt_issuers import JwksUnavailable, fetch_jwks

    with pytest.raises(JwksUnavailable, match="plain-http"):
        fetch_jwks("http://jwks.example.com/keys")


def test_issuer_clean_refuses_none() -> None:
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        ExternalIssuer(issuer=ISSUER, jwks_url="https://x/", algorithms="none").clean()
    with pytest.raises(ValidationError):
        ExternalIssuer(issuer=ISSUER, jwks_url="https://x/", algorithms="HS256").clean()
    assert ExternalIssuer(algorithms="RS256 none HS256").allowed_algorithms() == ["RS256"]
