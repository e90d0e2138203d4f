"""Fixtures of the adversarial tests: fresh counters and caches, no anonymous access."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache

from tenants import kv
from tenants.selectors import clear_limits_cache


@pytest.fixture(autouse=True)
def _hostile_env(settings: Any) -> Iterator[None]:
    settings.MCPTASKS = {**settings.MCPTASKS, "PUBLIC_URL": "", "ALLOW_ANONYMOUS": False}
    settings.CHANNEL_PREFIX = "sec" + secrets.token_hex(6)
    cache.clear()
    kv.reset()
    clear_limits_cache()
    yield
    cache.clear()
    kv.reset()
    clear_limits_cache()


@pytest.fixture
def tenant_a(db: None) -> Any:
    from tenants.services import get_or_create_tenant

    return get_or_create_tenant(slug="tenant-a")


@pytest.fixture
def tenant_b(db: None) -> Any:
    from tenants.services import get_or_create_tenant

    return get_or_create_tenant(slug="tenant-b")
