"""The task engine: the only code that builds task and session querysets.

Writes by responsibility: :mod:`~mcptasks.tasks.sessions`, :mod:`~mcptasks.tasks.creation`,
:mod:`~mcptasks.tasks.transitions` (the state machine and cancellation),
:mod:`~mcptasks.tasks.fanout` (who is told after a change), :mod:`~mcptasks.tasks.messages`
(input requests), :mod:`~mcptasks.tasks.runs` (what a worker does to a run),
:mod:`~mcptasks.tasks.cleanup` and :mod:`~mcptasks.tasks.auditing`; reads in
:mod:`~mcptasks.tasks.selectors` (and :mod:`~mcptasks.db.async_sql`, their no-thread-hop
path); the wire form of a task in each era in :mod:`~mcptasks.tasks.wire`; the 2026-07-28
era's own reads and writes in :mod:`~mcptasks.tasks.era2026`.
"""
