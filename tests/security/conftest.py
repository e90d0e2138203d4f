"""Fixtures of the adversarial tests: fresh counters and caches, no anonymous access."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.isolation import fresh_process_state


@pytest.fixture(autouse=True)
def _hostile_env(settings: Any) -> Iterator[None]:
    with fresh_process_state(settings, prefix="sec"):
        yield


@pytest.fixture
def tenant_a(db: None) -> Any:
    from tenants.services import get_or_create_tenant

    return get_or_create_tenant(slug="tenant-a")


@pytest.fixture
def tenant_b(db: None) -> Any:
    from tenants.services import get_or_create_tenant

    return get_or_create_tenant(slug="tenant-b")
