"""Shared fixtures for the tenants tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.isolation import fresh_process_state
from tests.support.oauth import ISSUER, RESOURCE, JwksServer, KeyPair


@pytest.fixture(autouse=True)
def _tenants_env(settings: Any) -> Iterator[None]:
    """Our own URLconf (the project's root URLconf is the lead's), fresh caches, no anonymity."""
    settings.ROOT_URLCONF = "tenants.urls"
    with fresh_process_state(settings):
        yield


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
def jwks_server(rsa_key: KeyPair, settings: Any) -> Iterator[JwksServer]:
    # The server listens on loopback, which the outbound policy refuses unless allowed.
    settings.TENANTS = {**settings.TENANTS, "OUTBOUND_ALLOWED_NETWORKS": ("127.0.0.0/8",)}
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
