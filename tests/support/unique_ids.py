"""Every collected test has an id of its own (``-p tests.support.unique_ids`` in ``addopts``).

pytest-xdist hands tests to its workers by node id, so of several tests sharing one id only one
runs, and the run still reports success: schemathesis's ``@schema.parametrize()`` gave all eight
operations of the audit API the same id, and `.ci/test.sh`'s parallel half ran one of them. A
collection with a duplicate id is refused instead, naming it.
"""

from __future__ import annotations

from collections import Counter

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a collection in which two tests share a node id."""
    shared = sorted(nodeid for nodeid, n in Counter(item.nodeid for item in items).items() if n > 1)
    if shared:
        listed = "\n  ".join(shared[:20])
        raise pytest.UsageError(
            f"{len(shared)} test id(s) are shared by several tests; pytest-xdist would run only one of each:\n"
            f"  {listed}\nGive each test an id of its own (pytest.mark.parametrize with ids=...)."
        )
