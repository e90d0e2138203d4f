"""Fixtures shared by every test package: real server stacks and MCP clients."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.client import McpClient
from tests.support.fast_subset import starts_processes
from tests.support.requirements import require_redis
from tests.support.sentinel_proc import PrivateSentinel
from tests.support.servers import Proc, Stack, make_stack


@pytest.fixture(autouse=True, scope="session")
def _own_counters_prefix() -> Iterator[None]:
    """Shared counters (Redis: the audit throttle, pattern counters) under a prefix of this test
    session's own: parallel sessions on one Redis, and earlier ones, never share a window."""
    from django.conf import settings

    previous = settings.CHANNEL_PREFIX
    settings.CHANNEL_PREFIX = f"{previous}-s{secrets.token_hex(4)}"
    yield
    settings.CHANNEL_PREFIX = previous


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing() -> Iterator[None]:
    """Passwords hashed with a cheap hasher: the tests sign users in by the hundred, and the
    production hasher's cost (by design about 0.3 s a hash) is not what they test."""
    from django.conf import settings
    from django.test.utils import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher",
                                             *settings.PASSWORD_HASHERS]):
        yield


@pytest.fixture(autouse=True)
def _async_reads_see_only_committed_rows(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests inside one rolled-back transaction read and write through the ORM's connection only.

    ``mcptasks.db.async_sql`` reads over a connection of its own, which (correctly) cannot see a
    test's uncommitted rows; transactional tests and real processes use it as production does.
    """
    marker = request.node.get_closest_marker("django_db")
    transactional = "transactional_db" in request.fixturenames or (
        marker is not None and bool(marker.kwargs.get("transaction") or (marker.args and marker.args[0]))
    )
    if transactional or (marker is None and "db" not in request.fixturenames):
        yield
        return
    settings = request.getfixturevalue("settings")
    settings.MCPTASKS = {**settings.MCPTASKS, "ASYNC_READS": False, "WRITE_THREADS": 0}
    yield


@pytest.fixture(scope="module")
@starts_processes
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSentinel]:
    """A private Redis primary + replica + 3 Sentinels for this module (tests/support/sentinel_proc.py)."""
    require_redis()
    s = PrivateSentinel(Path(tmp_path_factory.mktemp("sentinel")))
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
@starts_processes
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

