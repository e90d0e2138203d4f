"""Loaded by the soak's server processes (``bench/soak.py --tracemalloc``) through ``PYTHONPATH``.

On SIGUSR2 the process writes a tracemalloc snapshot to ``$SOAK_SNAPSHOT_DIR/<pid>-<n>.snap``, so
the soak can compare the heap of a running web process over time, grouped by allocation site.
The first signal also starts tracing (8 frames a trace): tracing from start-up would slow every
import, and what matters is what is allocated after the warm-up and still alive at the end.
"""

from __future__ import annotations

import itertools
import os
import signal
import tracemalloc
from pathlib import Path
from types import FrameType

_dir = os.environ.get("SOAK_SNAPSHOT_DIR")
_count = itertools.count()


def _dump(signum: int, frame: FrameType | None) -> None:
    if not _dir:
        return
    if not tracemalloc.is_tracing():
        tracemalloc.start(8)
    path = Path(_dir) / f"{os.getpid()}-{next(_count)}.snap"
    tracemalloc.take_snapshot().dump(str(path) + ".part")
    os.replace(str(path) + ".part", path)  # the soak reads only complete snapshots


if _dir:
    signal.signal(signal.SIGUSR2, _dump)
