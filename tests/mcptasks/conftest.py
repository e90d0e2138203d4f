"""Fixtures of the in-process task tests (the factories live in tests/support/factories.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mcptasks.models import McpSession, Task
from tenants.auth import AuthContext
from tenants.selectors import clear_limits_cache
from tests.support.factories import make_auth, make_session, make_task


@pytest.fixture(autouse=True)
def _no_limits_cache() -> Iterator[None]:
    """Tenant limits are cached per process; tests edit them, so start and end clean."""
    clear_limits_cache()
    yield
    clear_limits_cache()


@pytest.fixture
def auth(db: None) -> AuthContext:
    """A fresh principal in a fresh tenant."""
    return make_auth()


@pytest.fixture
def session(auth: AuthContext) -> McpSession:
    return make_session(auth)


@pytest.fixture
def task_factory(auth: AuthContext, session: McpSession) -> Callable[..., Task]:
    """``task_factory(ttl_ms=...)`` creates a task of ``auth`` in ``session``."""

    def factory(**kw: Any) -> Task:
        return make_task(auth, session, **kw)

    return factory
