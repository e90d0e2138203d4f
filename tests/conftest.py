"""Fixtures shared by every test package: real server stacks and MCP clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.client import McpClient
from tests.support.servers import Proc, Stack, make_stack


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/e2e carries the ``e2e`` marker (``-m 'not e2e'`` runs the rest)."""
    e2e_dir = Path(__file__).parent / "e2e"
    for item in items:
        if Path(str(item.fspath)).is_relative_to(e2e_dir):
            item.add_marker(pytest.mark.e2e)
