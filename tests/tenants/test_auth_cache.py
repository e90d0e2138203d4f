"""The per-process cache of verified tokens: reused briefly, never past expiry, cleared by edits."""

from __future__ import annotations

import time
from typing import Any

import pytest
from oauth2_provider.models import get_access_token_model

from tenants import auth_cache
from tenants.auth import authenticate, cached_context, remember
from tenants.auth_cache import cache
from tenants.context import AuthContext
from tenants.models import Tenant, TenantApplication
from tenants.services import issue_token
from tests.support.clock import frozen_clock

pytestmark = pytest.mark.django_db


def _headers(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _verify(token: str, resource_url: str) -> AuthContext:
    """What the MCP consumer does: the cache first, then authenticate() and remember()."""
    key, ctx = cached_context(headers=_headers(token), query_string="", resource_url=resource_url)
    if ctx is not None:
        return ctx
    ctx = authenticate(headers=_headers(token), query_string="", resource_url=resource_url)
    remember(key, ctx)
    return ctx


def _cached(token: str, resource_url: str) -> AuthContext | None:
    return cached_context(headers=_headers(token), query_string="", resource_url=resource_url)[1]


def test_a_verified_token_is_reused_without_a_query(
    tenant: Tenant, resource_url: str, django_assert_num_queries: Any
) -> None:
    token = issue_token(tenant=tenant, principal_name="robot", resource=resource_url)
    first = _verify(token, resource_url)
    with django_assert_num_queries(0):
        assert _verify(token, resource_url) == first
    # The key is bound to the resource: the same token elsewhere is verified again.
    assert _cached(token, resource_url + "/t/other") is None


def test_entries_lapse_after_auth_cache_s(tenant: Tenant, resource_url: str, settings: Any,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    settings.TENANTS = {**settings.TENANTS, "AUTH_CACHE_S": 0.2}
    token = issue_token(tenant=tenant, principal_name="robot", resource=resource_url)
    with frozen_clock(monkeypatch, auth_cache) as clock:
        _verify(token, resource_url)
        assert _cached(token, resource_url) is not None
        clock.advance(0.25)
        assert _cached(token, resource_url) is None


def test_entries_never_outlive_the_token(tenant: Tenant, resource_url: str, settings: Any,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    settings.TENANTS = {**settings.TENANTS, "AUTH_CACHE_S": 60}
    token = issue_token(tenant=tenant, principal_name="robot", resource=resource_url, expires_s=1)
    with frozen_clock(monkeypatch, auth_cache) as clock:
        ctx = _verify(token, resource_url)
        assert ctx.expires_at is not None and ctx.expires_at <= time.time() + 1.5
        assert _cached(token, resource_url) is not None
        clock.advance(max(0.0, ctx.expires_at - clock.time()) + 0.05)
        assert _cached(token, resource_url) is None


def test_zero_disables_the_cache(tenant: Tenant, resource_url: str, settings: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "AUTH_CACHE_S": 0}
    token = issue_token(tenant=tenant, principal_name="robot", resource=resource_url)
    _verify(token, resource_url)
    assert _cached(token, resource_url) is None


def test_revoking_or_disabling_in_this_process_clears_it_at_once(tenant: Tenant, resource_url: str) -> None:
    token = issue_token(tenant=tenant, principal_name="robot", resource=resource_url)
    _verify(token, resource_url)
    get_access_token_model().objects.get(token_checksum__isnull=False, application__tenant_link__tenant=tenant).delete()
    assert _cached(token, resource_url) is None

    token = issue_token(tenant=tenant, principal_name="robot", resource=resource_url)
    _verify(token, resource_url)
    tenant.active = False
    tenant.save()
    assert _cached(token, resource_url) is None

    tenant.active = True
    tenant.save()
    _verify(token, resource_url)
    link = TenantApplication.objects.get(tenant=tenant)
    link.save()  # e.g. narrowed grants
    assert _cached(token, resource_url) is None


def test_only_successes_are_kept_and_the_cache_is_bounded(tenant: Tenant, resource_url: str, settings: Any) -> None:
    from tenants.exceptions import AuthError

    with pytest.raises(AuthError):
        _verify("not-a-real-token", resource_url)
    assert len(cache) == 0
    settings.TENANTS = {**settings.TENANTS, "AUTH_CACHE_MAX_ENTRIES": 3}
    tokens = [issue_token(tenant=tenant, principal_name=f"robot{i}", resource=resource_url) for i in range(5)]
    for token in tokens:
        _verify(token, resource_url)
    assert len(cache) == 3
    assert _cached(tokens[0], resource_url) is None and _cached(tokens[-1], resource_url) is not None


def test_a_request_with_a_query_string_is_never_answered_from_the_cache(tenant: Tenant, resource_url: str) -> None:
    token = issue_token(tenant=tenant, principal_name="robot", resource=resource_url)
    _verify(token, resource_url)
    key, ctx = cached_context(headers=_headers(token), query_string=f"access_token={token}", resource_url=resource_url)
    assert key is None and ctx is None


def test_an_entry_is_due_in_the_last_quarter(tenant: Tenant, resource_url: str, settings: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    settings.TENANTS = {**settings.TENANTS, "AUTH_CACHE_S": 1.0}
    token = issue_token(tenant=tenant, principal_name="robot", resource=resource_url)
    with frozen_clock(monkeypatch, auth_cache) as clock:
        ctx = _verify(token, resource_url)
        key = cache.key(authorization=f"Bearer {token}", resource_url=resource_url)
        assert cache.get_due(key) == (ctx, False)
        clock.advance(0.8)
        assert cache.get_due(key) == (ctx, True)
        cache.drop(key)
        assert cache.get_due(key) == (None, False)
