"""Pagination of the static ``*/list`` results (tools, resources, templates, prompts) of both eras.

A cursor (:mod:`mcptasks.tasks.cursors`) is a signed (offset, list kind) pair: opaque to the
client, refused if forged or handed to another list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcptasks.protocol.errors import invalid_params
from mcptasks.tasks import cursors

_LIST_SALT = "mcptasks.list"


def _page(items: list[Any], cursor: str | None, size: int, kind: str) -> tuple[list[Any], str | None]:
    start = 0
    if cursor is not None:
        data = cursors.read(cursor, salt=_LIST_SALT)
        if data.get("k") != kind or not isinstance(data.get("o"), int):
            raise invalid_params("Invalid cursor")
        start = data["o"]
    page = items[start : start + size]
    nxt = cursors.sign({"k": kind, "o": start + size}, salt=_LIST_SALT) if start + size < len(items) else None
    return page, nxt


def list_result(key: str, items: list[Any], cursor: str | None, size: int) -> dict[str, Any]:
    """A ``*/list`` result: one page under ``key`` and ``nextCursor`` only when there is more."""
    page, nxt = _page(items, cursor, size, key)
    out: dict[str, Any] = {key: page}
    if nxt:
        out["nextCursor"] = nxt
    return out


def listing(name: str, table: Mapping[str, Any], cursor: str | None) -> dict[str, Any]:
    """One page of a registry table's definitions (resources, templates, prompts), in name order."""
    return list_result(name, [item.definition() for _, item in sorted(table.items())], cursor, 100)
