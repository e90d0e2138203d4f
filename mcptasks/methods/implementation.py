"""How a 2026-07-28 client sees the server: its Implementation object, shared by the method
table (:mod:`mcptasks.methods.era2026`) and the listen streams (:mod:`mcptasks.methods.listen`).

How it sees a task is the engine's: :func:`mcptasks.tasks.era2026_view.task_as_seen_by`.
"""

from __future__ import annotations

from typing import Any

from mcptasks.methods.era2025 import SERVER_NAME, SERVER_VERSION


def server_info() -> dict[str, Any]:
    """The server's Implementation object."""
    return {"name": SERVER_NAME, "title": "mcptasks", "version": SERVER_VERSION}
