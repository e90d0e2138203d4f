"""``MCPTASKS_GC_TUNING``: server processes freeze their start-up objects and collect less often."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from mcptasks.processes import gc_tuning


@pytest.fixture
def _restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("_restore_gc")
def test_on_by_default_it_freezes_and_raises_the_thresholds() -> None:
    gc.unfreeze()
    assert gc_tuning.tune() is True
    assert gc.get_threshold() == gc_tuning.THRESHOLDS
    assert gc.get_freeze_count() > 0


@pytest.mark.usefixtures("_restore_gc")
def test_off_keeps_pythons_defaults(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "GC_TUNING": False}
    gc.unfreeze()
    before = gc.get_threshold()
    assert gc_tuning.tune() is False
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


@pytest.mark.processes(reason="imports the ASGI entry point in a fresh interpreter")
def test_the_asgi_application_tunes_its_process() -> None:
    """Importing the entry point every web server loads (uvicorn, granian, daphne, ``serve``) is
    what tunes a web process; the worker command calls the same function."""
    code = ("import gc, mcptasks.asgi; from mcptasks.processes.gc_tuning import THRESHOLDS; "
            "print(gc.get_threshold() == THRESHOLDS, gc.get_freeze_count() > 1000)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "DEBUG": "1"})
    assert out.stdout.split() == ["True", "True"], out.stderr[-2000:]
