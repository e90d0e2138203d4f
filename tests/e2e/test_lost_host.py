"""Issue 28: a whole host lost mid-load, on loopback process groups (see tests/support/lost_host.py).

Three hosts (each one web process, daphne or granian, and one worker) share PostgreSQL and
Redis. Clients drive tasks through all three web processes; mid-load every process of the
third host gets SIGKILL. Then: every task created reaches exactly one terminal state (one
terminal audit event, a finished run behind each completion), the retryable runs the lost host held are
rerun by another worker, the non-retryable ones fail with "worker lost during execution",
nothing stays ``working`` past the lease, and the clients of the surviving hosts saw no error.
Process groups on loopback, their connections closed by the kill; the same scenario with hosts
in network namespaces, lost without FIN or RST behind PgBouncer and Sentinel, is
tests/e2e/test_reference_deployment.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.lost_host import HOST_ENV, Host, hosts, run
from tests.support.requirements import require_multiprocess
from tests.support.servers import Stack

LEASE_S = float(HOST_ENV["MCPTASKS_WORKER_LEASE_S"])


@pytest.fixture
def three_hosts(stack: Stack) -> Iterator[list[Host]]:
    """Three hosts on the shared stack, stopped after the test."""
    require_multiprocess()
    with hosts(stack, 3, concurrency=4) as hs:
        yield hs


def test_host_lost_mid_load_exactly_once(stack: Stack, three_hosts: list[Host]) -> None:
    out = run(stack, three_hosts, per_host=30, gap_s=0.1, ms=(500, 1500), settle_s=45)
    assert out.orphaned >= 1, "the lost host held no task at the kill: nothing was tested"
    assert out.problems == [], out.problems
    assert out.survivor_errors == [], out.survivor_errors
    # The last orphan was taken over once its lease lapsed (plus a poll, a heartbeat and a loaded machine).
    assert 0 < out.takeover_s < LEASE_S + 8, out.takeover_s
