"""Fixtures of the endpoint's in-process tests (the consumer driven through Channels' communicator)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import channel_layers


@pytest.fixture
def anonymous_in_memory(settings: Any) -> Iterator[None]:
    """Anonymous callers allowed, a fast worker poll, and the in-memory channel layer: each test
    runs its own event loop in one process, and channels-redis keeps one receive loop per
    process (Redis is covered end to end in e2e)."""
    settings.MCPTASKS = {**settings.MCPTASKS, "WORKER_POLL_S": 0.2}
    settings.TENANTS = {**settings.TENANTS, "ALLOW_ANONYMOUS": True}
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends = {}
    yield
    channel_layers.backends = {}
