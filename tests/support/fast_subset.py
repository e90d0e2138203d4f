"""The fast subset (``pytest -m fast``): every test that starts no process, marked and enforced.

Loaded as a plugin (``-p tests.support.fast_subset`` in pyproject.toml's ``addopts``) so that
its markers, hooks and fixture apply to every test directory alike, and so that a ``pytester``
run can load it on its own (tests/test_fast_subset.py proves the enforcement fails a test).

The markers (CONTRIBUTING.md, "Tests"):

- ``e2e``: every test under tests/e2e (real daphne/granian/worker processes). Also ``processes``.
- ``processes(reason)``: the test starts a process of its own (a subprocess, PgBouncer, Redis,
  Sentinel, PostgreSQL, a browser). Added by hand to a test that runs one itself, and
  automatically to every test that uses a fixture decorated with :func:`starts_processes`
  (directly or through other fixtures, e.g. everything using ``stack``/``server``/``client``).
- ``slow(reason)``: starts no process but takes too long for the one-minute fast subset.
- ``fast``: added to every test that carries none of the three above.

Enforcement: while a ``fast`` test runs, starting a process (``subprocess.Popen``, which
``subprocess.run`` and asyncio's subprocesses use, or ``os.fork``/``os.posix_spawn``/
``os.system``) raises, and the test fails at teardown even if the code under test swallowed
the exception. So a test cannot sit in the fast subset by mistake.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

import pytest

F = TypeVar("F", bound=Callable[..., Any])

TESTS = Path(__file__).resolve().parent.parent
E2E = TESTS / "e2e"
STARTS_PROCESSES = "__starts_processes__"


CALL_FAILED = pytest.StashKey[bool]()


class StartedAProcess(AssertionError):
    """Raised when a test of the fast subset starts a process."""


def starts_processes(fixture: F) -> F:
    """Declare that a fixture starts processes: every test using it is left out of ``-m fast``.

    Put it under ``@pytest.fixture``. Fixtures built on one so declared need nothing: the
    marking follows the fixture closure (every fixture a test uses, directly or not).
    """
    setattr(fixture, STARTS_PROCESSES, True)
    return fixture


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: starts real daphne/worker subprocesses (every test under tests/e2e)")
    config.addinivalue_line(
        "markers", "processes(reason): starts processes of its own (auto for e2e and @starts_processes fixtures)"
    )
    config.addinivalue_line("markers", "slow(reason): starts no process, but too slow for the fast subset")
    config.addinivalue_line(
        "markers", "fast: starts no process (auto: every test with no e2e/processes/slow marker; enforced)"
    )


def _uses_process_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(getattr(d.func, STARTS_PROCESSES, False) for defs in info.name2fixturedefs.values() for d in defs)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark e2e and process-starting tests; everything else is ``fast``."""
    for item in items:
        path = Path(str(item.path))
        if path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.processes(reason="end-to-end: real server processes"))
        elif _uses_process_fixture(item):
            item.add_marker(pytest.mark.processes(reason="uses a fixture that starts processes"))
        if not any(item.get_closest_marker(name) for name in ("e2e", "processes", "slow")):
            item.add_marker(pytest.mark.fast)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Remember whether the test itself failed: the teardown check then adds no second report."""
    report = yield
    if call.when == "call":
        item.stash[CALL_FAILED] = bool(getattr(report, "failed", False))
    return report


def _refuse(nodeid: str, started: list[str], what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        started.append(what)
        raise StartedAProcess(_message(nodeid, what))

    return refuse


def _message(nodeid: str, what: str) -> str:
    return (
        f"{nodeid} is in the fast subset (no 'processes', 'slow' or 'e2e' marker) but started a process: "
        f"{what}. Fast tests start no process: mark the test @pytest.mark.processes(reason=...), or "
        f"decorate the fixture that starts it with tests.support.fast_subset.starts_processes."
    )


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """A ``fast`` test that starts a process fails, with a message saying how to mark it."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    nodeid = request.node.nodeid
    started: list[str] = []
    popen_init = subprocess.Popen.__init__

    def refuse_popen(self: subprocess.Popen[Any], args: Any, *a: Any, **kw: Any) -> None:
        self._child_created, self.returncode = False, None  # read by Popen.__del__ and repr()
        what = f"subprocess.Popen({args!r})"
        started.append(what)
        raise StartedAProcess(_message(nodeid, what))

    with (
        mock.patch.object(subprocess.Popen, "__init__", refuse_popen),
        mock.patch.object(os, "fork", _refuse(nodeid, started, "os.fork()")),
        mock.patch.object(os, "posix_spawn", _refuse(nodeid, started, "os.posix_spawn()")),
        mock.patch.object(os, "posix_spawnp", _refuse(nodeid, started, "os.posix_spawnp()")),
        mock.patch.object(os, "system", _refuse(nodeid, started, "os.system()")),
    ):
        yield
    assert subprocess.Popen.__init__ is popen_init
    # The code under test may have swallowed the exception: then the test fails here.
    if started and not request.node.stash.get(CALL_FAILED, False):
        pytest.fail(_message(nodeid, ", ".join(started)), pytrace=False)
