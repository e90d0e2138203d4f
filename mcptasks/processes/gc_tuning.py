"""Garbage-collector settings for long-running server processes (``MCPTASKS_GC_TUNING``)."""

from __future__ import annotations

import gc

from mcptasks import conf

#: Collection thresholds of the three generations (Python's defaults are 700, 10, 10).
THRESHOLDS = (20_000, 50, 50)


def tune() -> bool:
    """Freeze what start-up made and collect less often; whether it did (the setting may be off).

    A full collection scans every object the collector tracks: in a web process, all of Django's
    and the application's start-up objects, tens of milliseconds each time, while every request
    of the process waits. Under bench/create_load.py's 50 clients that was the creation p99
    (207 ms, 84 ms with these settings; issue 27). Frozen objects are never scanned again, and the
    higher thresholds make collections rarer; garbage cycles live a little longer before they go.
    """
    if not conf.get().GC_TUNING:
        return False
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    return True
