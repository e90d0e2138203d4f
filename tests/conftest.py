"""Fixtures shared by every test package: real server stacks and MCP clients."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.client import McpClient
from tests.support.servers import Proc, Stack, make_stack

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


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A database (and channel prefix) of its own for this test session's server processes."""
    st, teardown = make_stack(tmp_path_factory.mktemp("stack"))
    try:
        yield st
    finally:
        teardown()


@pytest.fixture(scope="module")
def server(stack: Stack) -> Iterator[Proc]:
    """One daphne process; with PostgreSQL + Redis plus one separate worker, else embedded."""
    procs: list[Proc] = []
    proc = stack.daphne()
    procs.append(proc)
    if stack.multi_process:
        procs.append(stack.worker(concurrency=8))
    yield proc
    for p in procs:
        p.terminate(timeout=10)


@pytest.fixture
def client(server: Proc) -> Iterator[McpClient]:
    """An initialized anonymous client of ``server``."""
    with McpClient(server.url) as c:
        c.initialize()
        yield c


@pytest.fixture(scope="module")
def auth_server(stack: Stack) -> Iterator[Proc]:
    """A daphne that admits only bearer tokens (plus a separate worker on PostgreSQL + Redis)."""
    procs = [stack.daphne(extra_env={"MCPTASKS_ALLOW_ANONYMOUS": "0"})]
    if stack.multi_process:
        procs.append(stack.worker(concurrency=4))
    yield procs[0]
    for p in procs:
        p.terminate(timeout=10)
