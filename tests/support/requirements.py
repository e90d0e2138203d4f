"""What a test needs from its environment: skip (saying why) or, in CI, fail.

CI (``.ci/run``) sets ``MCPTASKS_REQUIRE_SERVICES=1``: then a test that would skip for lack of
PostgreSQL, Redis or a package fails instead.
"""

from __future__ import annotations

import os

import pytest

ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
ON_REDIS = bool(os.environ.get("REDIS_URL"))


# CI (.ci/run) sets this: a test that would skip for lack of PostgreSQL/Redis fails instead.
REQUIRE_SERVICES = os.environ.get("MCPTASKS_REQUIRE_SERVICES") == "1"


def skip_or_fail(reason: str) -> None:
    """Skip (printing why), or fail when CI requires every service and package to be present."""
    _skip(reason)


def _skip(reason: str) -> None:
    if REQUIRE_SERVICES:
        pytest.fail(f"MCPTASKS_REQUIRE_SERVICES=1 but this test {reason}")
    pytest.skip(reason)


def require_postgres() -> None:
    """Skip (with the reason printed in the summary) unless the tests run on PostgreSQL."""
    if not ON_POSTGRES:
        _skip("needs PostgreSQL: set DATABASE_URL=postgres://... (CI does)")


def require_redis() -> None:
    """Skip unless the tests have a Redis (REDIS_URL)."""
    if not ON_REDIS:
        _skip("needs Redis: set REDIS_URL=redis://... (CI does)")


def require_multiprocess() -> None:
    """Skip unless several processes can share state (PostgreSQL + Redis)."""
    if not (ON_POSTGRES and ON_REDIS):
        _skip("needs PostgreSQL and Redis shared by several processes: set DATABASE_URL and REDIS_URL (CI does)")
