"""The private Sentinel deployment the failover tests stand on (tests/support/sentinel_proc.py)."""

from __future__ import annotations

from tests.support.sentinel_proc import PrivateSentinel


def test_two_failovers_in_a_row_both_promote_a_replica_in_sync(sentinel: PrivateSentinel) -> None:
    """Right after a failover the demoted primary still leads for up to 10 s (the Sentinels turn
    it into a replica on their next INFO). A second failover then got NOGOODSLAVE, which failed a
    CI run; the helper now waits for a replica in sync, so what was written before survives."""
    first = sentinel.failover()
    sentinel.wait_settled()
    node = sentinel.node(first)
    assert node is not None
    node.client().set("written-before-the-second-failover", "kept")
    second = sentinel.failover()
    assert second != first
    promoted = sentinel.node(second)
    assert promoted is not None
    assert promoted.client().get("written-before-the-second-failover") == b"kept"
