"""Per-test isolation of process-wide state: caches, shared counters, cached tenant limits."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.cache import cache

from tenants import kv
from tenants.auth_cache import cache as auth_cache
from tenants.selectors import clear_limits_cache


@contextmanager
def fresh_process_state(settings: Any, *, prefix: str = "t") -> Iterator[None]:
    """No anonymity, no PUBLIC_URL, a counters prefix of this test's own, empty caches."""
    settings.TENANTS = {**settings.TENANTS, "PUBLIC_URL": "", "ALLOW_ANONYMOUS": False}
    # Shared counters (Redis in CI) get a prefix of their own per test: no leftovers.
    settings.CHANNEL_PREFIX = prefix + secrets.token_hex(6)
    cache.clear()
    auth_cache.clear()
    kv.reset()
    clear_limits_cache()
    try:
        yield
    finally:
        cache.clear()
        auth_cache.clear()
        kv.reset()
        clear_limits_cache()
