"""A collection in which two tests share an id is refused (pytest-xdist would run one of them)."""

from __future__ import annotations

import pytest

PLUGINS = ("-p", "tests.support.unique_ids", "-p", "no:django", "-p", "no:randomly", "-p", "no:cacheprovider",
           "-o", "asyncio_default_fixture_loop_scope=function")


def test_tests_sharing_an_id_are_refused_by_name(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner="""
        def test_one():
            pass

        def test_two():
            pass
    """)
    # A collector that makes three items of one name, as schemathesis's parametrize did.
    pytester.makeconftest("""
        import pytest

        class Shared(pytest.Item):
            def runtest(self):
                pass

        @pytest.hookimpl(wrapper=True)
        def pytest_pycollect_makeitem(collector, name, obj):
            items = yield
            if name == "test_one":
                return [Shared.from_parent(collector, name="test_one") for _ in range(3)]
            return items
    """)
    result = pytester.runpytest_inprocess(*PLUGINS)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*1 test id(s) are shared by several tests*", "*test_inner.py::test_one"])


def test_distinct_ids_pass(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner="""
        import pytest

        @pytest.mark.parametrize("n", [1, 2, 3])
        def test_one(n):
            assert n
    """)
    result = pytester.runpytest_inprocess(*PLUGINS)
    result.assert_outcomes(passed=3)
