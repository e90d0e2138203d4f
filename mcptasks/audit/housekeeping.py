"""The periodic pass of the audit trail that every process runs (the worker's lease thread, serve)."""

from __future__ import annotations

from mcptasks import conf
from mcptasks.audit import throttle, trail

#: A web process beside workers seals only events its workers have left unsealed for this many
#: sealing intervals (:func:`housekeep`'s ``backstop``).
BACKSTOP_INTERVALS = 5


def housekeep(*, backstop: bool = False) -> int:
    """Write the suppressed-refusal counts of ended throttle windows
    (:func:`mcptasks.audit.throttle.flush_suppressed`), then seal (:func:`mcptasks.audit.trail.seal`).
    Returns the events sealed.

    ``backstop`` (a web process whose tasks run in worker processes): seal only once the oldest
    unsealed event is ``BACKSTOP_INTERVALS`` sealing intervals old, that is when no worker is
    sealing. Issue 27: hashing in the web processes' threads cost their event loops CPU and
    latency for work a worker does anyway.
    """
    throttle.flush_suppressed()
    if backstop:
        return trail.seal(older_than_s=BACKSTOP_INTERVALS * conf.get().AUDIT_SEAL_INTERVAL_S)
    return trail.seal()
