"""A clock a test moves by hand, instead of sleeping past a TTL or to a window's boundary.

The code reads time through its module's ``time`` (``time.time()``, ``time.monotonic()``);
:func:`frozen_clock` replaces that name in the modules given by a :class:`Clock` that starts at
the real time and moves only when told. Everything else in the ``time`` module (``sleep``,
``perf_counter``, ...) stays the real one, and other modules keep the real clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import pytest


class Clock:
    """Stands in for the ``time`` module: ``time()`` and ``monotonic()`` advance only by hand."""

    def __init__(self) -> None:
        self._wall = time.time()
        self._mono = time.monotonic()

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds``."""
        assert seconds >= 0, "time only moves forward"
        self._wall += seconds
        self._mono += seconds

    def to_next_multiple_of(self, period_s: float, plus: float = 0.01) -> None:
        """Move to just past the next multiple of ``period_s`` (a fixed window's start)."""
        self.advance(period_s - self._wall % period_s + plus)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@contextmanager
def frozen_clock(monkeypatch: pytest.MonkeyPatch, *modules: ModuleType) -> Iterator[Clock]:
    """A :class:`Clock` read as ``time`` by each of ``modules`` (for the context's duration)."""
    clock = Clock()
    with monkeypatch.context() as m:
        for module in modules:
            assert getattr(module, "time", None) is time, f"{module.__name__} does not read the time module"
            m.setattr(module, "time", clock)
        yield clock
