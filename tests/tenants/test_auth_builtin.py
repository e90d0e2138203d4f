"""authenticate() with tokens of the built-in authorization server, anonymous mode, challenges."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.utils import timezone
from oauth2_provider.models import get_access_token_model, get_application_model

from tenants.auth import AuthError, authenticate, insufficient_scope, prm_url
from tenants.models import Principal
from tenants.services import issue_token

pytestmark = pytest.mark.django_db

PRM = "http://testserver/.well-known/oauth-protected-resource/mcp"


def _auth(token: str | None, resource_url: str, query: str = "") -> Any:
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    return authenticate(headers=headers, query_string=query, resource_url=resource_url)


def _refused(token: str | None, resource_url: str, query: str = "", status: int = 401) -> AuthError:
    with pytest.raises(AuthError) as info:
        _auth(token, resource_url, query)
    err = info.value
    assert err.status == status
    assert f'resource_metadata="{PRM}"' in err.headers["WWW-Authenticate"]
    assert err.headers["WWW-Authenticate"].startswith("Bearer ")
    assert err.body["jsonrpc"] == "2.0" and "id" not in err.body
    assert err.body["error"]["code"] == -32001
    return err


def test_prm_url_is_path_inserted() -> None:
    assert (
        prm_url("http://127.0.0.1:8000/mcp")
        == "http://127.0.0.1:8000/.well-known/oauth-protected-resource/mcp"
    )
    assert (
        prm_url("HTTPS://Example.COM:443/mcp/")
        == "https://example.com/.well-known/oauth-protected-resource/mcp"
    )


def test_valid_token_gives_tenant_and_principal(tenant: Any, resource_url: str) -> None:
    token = issue_token(tenant=tenant, principal_name="robot", resource=resource_url)
    ctx = _auth(token, resource_url)
    assert ctx.tenant_id == tenant.pk and ctx.tenant_slug == "acme"
    principal = Principal.objects.get(pk=ctx.principal_id)
    assert principal.kind == Principal.Kind.CLIENT and principal.name == "robot"
    assert ctx.scopes == frozenset({"mcp:tools", "mcp:tasks"})
    assert not ctx.anonymous and ctx.credential_ref.startswith("dot:")
    # Same principal again: the application is reused.
    again = _auth(issue_token(tenant=tenant, principal_name="robot", resource=resource_url), resource_url)
    assert again.principal_id == ctx.principal_id


def test_token_is_stored_hashed_only(tenant: Any, resource_url: str) -> None:
    token = issue_token(tenant=tenant, resource=resource_url)
    access = get_access_token_model().objects.get()
    assert access.token == ""
    assert access.token_checksum == hashlib.sha256(token.encode()).hexdigest()
    assert access.resource == [resource_url]


def test_token_in_query_string_is_refused(tenant: Any, resource_url: str) -> None:
    token = issue_token(tenant=tenant, resource=resource_url)
    err = _refused(None, resource_url, query=f"access_token={token}", status=400)
    assert 'error="invalid_request"' in err.headers["WWW-Authenticate"]
    # Even together with a valid header.
    _refused(token, resource_url, query=f"x=1&access_token={token}", status=400)


def test_missing_token(tenant: Any, resource_url: str) -> None:
    err = _refused(None, resource_url)
    assert "error=" not in err.headers["WWW-Authenticate"]
    assert 'scope="mcp:tools mcp:tasks"' in err.headers["WWW-Authenticate"]


def test_garbage_and_other_schemes(tenant: Any, resource_url: str) -> None:
    err = _refused("not-a-real-token", resource_url)
    assert 'error="invalid_token"' in err.headers["WWW-Authenticate"]
    with pytest.raises(AuthError) as info:
        authenticate(
            headers={"authorization": "Basic dXNlcjpwYXNz"}, query_string="", resource_url=resource_url
        )
    assert info.value.status == 401
    _refused("bad token with spaces", resource_url)


def test_expired_token(tenant: Any, resource_url: str) -> None:
    token = issue_token(tenant=tenant, resource=resource_url)
    get_access_token_model().objects.update(expires=timezone.now() - timedelta(seconds=1))
    err = _refused(token, resource_url)
    assert "expired" in err.message


def test_revoked_token(tenant: Any, resource_url: str) -> None:
    token = issue_token(tenant=tenant, resource=resource_url)
    assert _auth(token, resource_url).tenant_id == tenant.pk
    get_access_token_model().objects.get().revoke()
    err = _refused(token, resource_url)
    assert 'error="invalid_token"' in err.headers["WWW-Authenticate"]


def test_wrong_audience_token(tenant: Any, resource_url: str) -> None:
    token = issue_token(tenant=tenant, resource="https://other.example.com/mcp")
    err = _refused(token, resource_url)
    assert "not issued for this resource" in err.message
    # The same server on another port is another resource.
    token2 = issue_token(tenant=tenant, resource="http://testserver:8001/mcp")
    _refused(token2, resource_url)


def test_public_url_is_the_canonical_resource(tenant: Any, settings: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "PUBLIC_URL": "https://mcp.example.com/"}
    token = issue_token(tenant=tenant)  # bound to PUBLIC_URL + MCP_PATH by default
    assert get_access_token_model().objects.get().resource == ["https://mcp.example.com/mcp"]
    # Whatever URL the request came in on, the canonical resource is PUBLIC_URL's.
    ctx = _auth(token, "http://10.0.0.5:8000/mcp")
    assert ctx.tenant_id == tenant.pk
    with pytest.raises(AuthError) as info:
        _auth(issue_token(tenant=tenant, resource="http://10.0.0.5:8000/mcp"), "http://10.0.0.5:8000/mcp")
    assert info.value.status == 401
    assert (
        'resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp"'
        in (info.value.headers["WWW-Authenticate"])
    )


def test_application_without_tenant_is_refused(tenant: Any, resource_url: str) -> None:
    from oauth2_provider.models import set_token_value

    app_model = get_application_model()
    app = app_model.objects.create(
        name="stray",
        client_type=app_model.CLIENT_CONFIDENTIAL,
        authorization_grant_type=app_model.GRANT_CLIENT_CREDENTIALS,
    )
    access = get_access_token_model()(
        application=app,
        expires=timezone.now() + timedelta(hours=1),
        scope="mcp:tools",
        resource=[resource_url],
    )
    set_token_value(access, "stray-token-value-0123456789")
    access.save()
    err = _refused("stray-token-value-0123456789", resource_url)
    assert "tenant" in err.message


def test_disabled_tenant(tenant: Any, resource_url: str) -> None:
    token = issue_token(tenant=tenant, resource=resource_url)
    tenant.active = False
    tenant.save()
    assert "disabled" in _refused(token, resource_url).message


def test_insufficient_scope() -> None:
    err = insufficient_scope(scope="mcp:tasks", resource_url="http://testserver/mcp")
    assert err.status == 403
    header = err.headers["WWW-Authenticate"]
    assert 'error="insufficient_scope"' in header and 'scope="mcp:tasks"' in header
    assert f'resource_metadata="{PRM}"' in header
    assert err.body["error"]["data"] == {"scope": "mcp:tasks"}


def test_token_scopes_are_reported(tenant: Any, resource_url: str) -> None:
    token = issue_token(tenant=tenant, scopes=["mcp:tools"], resource=resource_url)
    ctx = _auth(token, resource_url)
    assert ctx.has_scope("mcp:tools") and not ctx.has_scope("mcp:tasks")
    with pytest.raises(ValueError):
        issue_token(tenant=tenant, scopes=["admin"])


def test_anonymous_mode(settings: Any, db: None, resource_url: str) -> None:
    settings.TENANTS = {**settings.TENANTS, "ALLOW_ANONYMOUS": True, "DEFAULT_TENANT": "public"}
    ctx = _auth(None, resource_url)
    assert ctx.anonymous and ctx.tenant_slug == "public"
    assert Principal.objects.get(pk=ctx.principal_id).kind == Principal.Kind.ANONYMOUS
    assert ctx.has_scope("mcp:tasks")
    assert _auth(None, resource_url).principal_id == ctx.principal_id
    # A bad token is still refused: anonymity applies only without an Authorization header.
    _refused("nope", resource_url)


def test_anonymous_off_requires_token(db: None, resource_url: str) -> None:
    _refused(None, resource_url)


def test_check_warns_anonymous_without_debug(settings: Any) -> None:
    settings.DEBUG = False
    settings.TENANTS = {**settings.TENANTS, "ALLOW_ANONYMOUS": True}
    assert "tenants.W001" in {m.id for m in run_checks(tags=None) if m.id}
    settings.DEBUG = True
    assert "tenants.W001" not in {m.id for m in run_checks() if m.id}


def test_loopback_names_are_the_same_resource(tenant: Any) -> None:
    """Issue 12: a dev token bound to 127.0.0.1 also works at localhost (and [::1]), nowhere else."""
    token = issue_token(tenant=tenant, resource="http://127.0.0.1:8000/mcp")
    for url in ("http://localhost:8000/mcp", "http://[::1]:8000/mcp", "http://127.0.0.1:8000/mcp"):
        assert _auth(token, url).tenant_id == tenant.pk
    for url in ("http://localhost:8001/mcp", "http://example.com:8000/mcp", "https://localhost:8000/mcp"):
        with pytest.raises(AuthError) as info:
            _auth(token, url)
        assert info.value.status == 401
