"""The periodic pass of the audit trail that every process runs (the worker's lease thread, serve)."""

from __future__ import annotations

from mcptasks.audit import throttle, trail


def housekeep() -> int:
    """Write the suppressed-refusal counts of ended throttle windows
    (:func:`mcptasks.audit.throttle.flush_suppressed`), then seal (:func:`mcptasks.audit.trail.seal`).
    Returns the events sealed."""
    throttle.flush_suppressed()
    return trail.seal()
