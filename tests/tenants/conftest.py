"""Shared fixtures for the tenants tests."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache

from tenants import kv
from tenants.selectors import clear_limits_cache
from tests.tenants.tenants_testutil import ISSUER, RESOURCE, JwksServer, KeyPair


@pytest.fixture(autouse=True)
def _tenants_env(settings: Any) -> Iterator[None]:
    """Our own URLconf (the project's root URLconf is the lead's), fresh caches, no anonymity."""
    settings.ROOT_URLCONF = "tenants.urls"
    settings.MCPTASKS = {**settings.MCPTASKS, "PUBLIC_URL": "", "ALLOW_ANONYMOUS": False}
    # Shared counters (Redis in CI) get a prefix of their own per test: no leftovers.
    settings.CHANNEL_PREFIX = "t" + secrets.token_hex(6)
    cache.clear()
    kv.reset()
    clear_limits_cache()
    yield
    cache.clear()
    kv.reset()
    clear_limits_cache()


@pytest.fixture
def resource_url() -> str:
    return RESOURCE


@pytest.fixture
def tenant(db: None) -> Any:
    from tenants.services import get_or_create_tenant

    return get_or_create_tenant(slug="acme", name="Acme")


@pytest.fixture(scope="session")
def rsa_key() -> KeyPair:
    return KeyPair("k1")


@pytest.fixture(scope="session")
def other_key() -> KeyPair:
    return KeyPair("k1")  # same kid, different key material


@pytest.fixture
def jwks_server(rsa_key: KeyPair) -> Iterator[JwksServer]:
    server = JwksServer()
    server.keys = [rsa_key.jwk]
    yield server
    server.close()


@pytest.fixture
def external_issuer(tenant: Any, jwks_server: JwksServer) -> Any:
    from tenants.models import ExternalIssuer

    return ExternalIssuer.objects.create(
        tenant=tenant,
        issuer=ISSUER,
        jwks_url=jwks_server.url,
        tenant_claim="org",
        principal_claim="sub",
        scopes_claim="scope",
    )
