"""The benches' reading of how long each role waited for a core (bench/e2e_load.py)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from bench.e2e_load import _per_role_ms, _run_queue_ns

pytestmark = pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task"), reason="needs Linux's /proc")


def test_a_process_that_waits_for_a_core_is_read_as_waiting() -> None:
    """Two busy threads on one CPU: while one runs, the other waits, and the reading grows."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs sched_setaffinity")
    if not os.path.exists(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat"):
        pytest.skip("this kernel keeps no schedstats")
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        before = _run_queue_ns([os.getpid()])
        stop = time.monotonic() + 0.3

        def spin() -> None:
            while time.monotonic() < stop:
                pass

        # Threads of this process share one CPU; the GIL hands the core back and forth, and the
        # kernel counts the time each thread was runnable but not running.
        threads = [threading.Thread(target=spin) for _ in range(2)]
        for t in threads:
            t.start()
        spin()
        for t in threads:
            t.join()
        after = _run_queue_ns([os.getpid()])
    finally:
        os.sched_setaffinity(0, allowed)
    assert after[os.getpid()] > before[os.getpid()]


def test_a_vanished_process_is_left_out_not_counted_negative() -> None:
    gone = 2**22 + 12345  # above the default pid_max: no such process
    assert _run_queue_ns([gone]) == {}
    roles = {"web": [1, gone]}
    assert _per_role_ms(roles, {1: 1_000_000, gone: 5_000_000_000}, {1: 3_000_000}, scale=1e9, n=2) == {"web": 1.0}
