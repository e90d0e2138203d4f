"""The fast subset's rules hold: a ``fast`` test that starts a process fails, with a clear message.

Each case runs a small test file in a pytest of its own (``pytester``, in this process: no
subprocess, so these tests are themselves fast) with only tests/support/fast_subset.py loaded.
"""

from __future__ import annotations

import pytest

PLUGINS = ("-p", "tests.support.fast_subset", "-p", "no:django", "-p", "no:randomly", "-p", "no:cacheprovider",
           "-o", "asyncio_default_fixture_loop_scope=function")


def _run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_inner=source)
    return pytester.runpytest_inprocess(*PLUGINS, *args)


def test_a_fast_test_that_starts_a_process_fails_and_says_how_to_mark_it(pytester: pytest.Pytester) -> None:
    result = _run(pytester, """
        import subprocess, sys

        def test_spawns():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
    """, "-m", "fast")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["E * test_inner.py::test_spawns is in the fast subset*started a process*@pytest.mark.processes(*"]
    )


def test_a_swallowed_refusal_still_fails_the_test(pytester: pytest.Pytester) -> None:
    result = _run(pytester, """
        import asyncio, sys

        async def spawn():
            try:
                proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
                await proc.wait()
            except BaseException:
                pass  # the code under test hides the failure

        def test_spawns_quietly():
            asyncio.run(spawn())
    """)
    result.assert_outcomes(passed=1, errors=1)  # the test body passed; its teardown reports the process
    result.stdout.fnmatch_lines(["*is in the fast subset*but started a process*"])


@pytest.mark.processes(reason="its inner tests run child interpreters")
def test_marked_tests_and_tests_using_a_process_fixture_may_start_processes(pytester: pytest.Pytester) -> None:
    result = _run(pytester, """
        import subprocess, sys
        import pytest
        from tests.support.fast_subset import starts_processes

        @pytest.fixture
        @starts_processes
        def child():
            return subprocess.run([sys.executable, "-c", "print('hi')"], capture_output=True, text=True).stdout

        @pytest.fixture
        def built_on_it(child):
            return child

        @pytest.mark.processes(reason="runs a child interpreter")
        def test_marked():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_through_a_fixture(built_on_it):
            assert built_on_it == "hi\\n"

        @pytest.mark.slow(reason="slow, not a process")
        def test_slow():
            pass

        def test_plain():
            pass
    """, "-m", "not fast")
    result.assert_outcomes(passed=3, deselected=1)
