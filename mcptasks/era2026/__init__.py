"""The 2026-07-28 protocol era: a stateless adapter over the same durable task engine.

``transport`` picks this era for a POST without a session that carries per-request ``_meta``
(or a 2026-07-28 ``MCP-Protocol-Version``), checks the SEP-2243 headers and the ``_meta``,
applies the same scopes and rate limits as the 2025-11-25 path and calls ``handlers``.
``state`` signs the ``requestState`` of InputRequiredResult rounds. Tasks, workers, quotas and
audit are the ones :mod:`mcptasks.services` and :mod:`mcptasks.selectors` provide.
"""
