"""Fixtures shared by the end-to-end modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.live_support import Pair, start_pair
from tests.support.servers import Stack


@pytest.fixture(scope="module")
def pair(stack: Stack, request: pytest.FixtureRequest) -> Iterator[Pair]:
    """Two daphne processes and two workers (one daphne on SQLite); a module may set ``PAIR_ENV``."""
    with start_pair(stack, extra_env=getattr(request.module, "PAIR_ENV", None)) as p:
        yield p
