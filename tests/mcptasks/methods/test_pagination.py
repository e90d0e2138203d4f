"""The static ``*/list`` pagination: cursors are opaque, refused when forged, and the same page
always gets the same cursor (an e2e test compared two tools/list results that straddled a second)."""

from __future__ import annotations

import types

import pytest

from mcptasks.methods.pagination import list_result
from mcptasks.protocol.errors import McpError


def _clock(monkeypatch: pytest.MonkeyPatch, now: float) -> None:
    # django.core.signing reads the time through its module-level ``time`` import.
    monkeypatch.setattr("django.core.signing.time", types.SimpleNamespace(time=lambda: now))


def test_the_same_page_gets_the_same_cursor_seconds_later(monkeypatch: pytest.MonkeyPatch) -> None:
    items = list(range(7))
    _clock(monkeypatch, 1_800_000_000.0)
    first = list_result("tools", items, None, 3)
    _clock(monkeypatch, 1_800_000_100.0)
    second = list_result("tools", items, None, 3)
    assert first == second and first["nextCursor"]


def test_a_walk_visits_every_item_once_and_ends_without_a_cursor() -> None:
    items = list(range(7))
    seen: list[int] = []
    cursor = None
    for _ in range(5):
        page = list_result("tools", items, cursor, 3)
        seen += page["tools"]
        cursor = page.get("nextCursor")
        if cursor is None:
            break
    assert seen == items and cursor is None


@pytest.mark.parametrize("kind", ["prompts", "resources"])
def test_a_cursor_of_another_list_or_a_forged_one_is_refused(kind: str) -> None:
    cursor = list_result("tools", list(range(7)), None, 3)["nextCursor"]
    forged = cursor[:-1] + ("A" if cursor[-1] != "A" else "B")
    for bad in (cursor, forged):
        with pytest.raises(McpError) as exc:
            list_result(kind if bad is cursor else "tools", list(range(7)), bad, 3)
        assert exc.value.code == -32602 and exc.value.message == "Invalid cursor"
