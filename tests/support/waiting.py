"""Polling with a deadline, for tests that wait on other processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20.0, every: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")
