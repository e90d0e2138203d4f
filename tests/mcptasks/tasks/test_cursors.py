"""Pagination cursors (mcptasks.tasks.cursors): stable text, the older timestamped format still
read, anything forged or signed for another list refused with -32602."""

from __future__ import annotations

import types

import pytest
from django.core import signing

from mcptasks.protocol.errors import McpError
from mcptasks.tasks import cursors

SALT = "mcptasks.test"


def _refused(cursor: str, salt: str = SALT) -> McpError:
    with pytest.raises(McpError) as exc:
        cursors.read(cursor, salt=salt)
    assert exc.value.code == -32602 and exc.value.message == "Invalid cursor"
    return exc.value


def test_a_cursor_reads_back_and_its_text_does_not_change_with_time(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = []
    for now in (1_800_000_000.0, 1_800_000_100.0):
        monkeypatch.setattr("django.core.signing.time", types.SimpleNamespace(time=lambda now=now: now))
        texts.append(cursors.sign({"o": 50, "k": "tools"}, salt=SALT))
    assert texts[0] == texts[1]
    assert cursors.read(texts[0], salt=SALT) == {"o": 50, "k": "tools"}


def test_a_cursor_signed_with_a_timestamp_before_the_upgrade_is_still_read() -> None:
    old = signing.dumps({"s": 7, "p": 3}, salt=SALT, compress=False)
    assert cursors.read(old, salt=SALT) == {"s": 7, "p": 3}


@pytest.mark.parametrize("bad", ["", "garbage", "e30:abc", "eyJzIjoxLCJwIjoxfQ:1abc:xyz"])
def test_garbage_is_refused(bad: str) -> None:
    _refused(bad)


def test_a_forged_or_foreign_cursor_is_refused() -> None:
    good = cursors.sign({"o": 1}, salt=SALT)
    payload, _, mac = good.rpartition(":")
    _refused(payload[:-1] + ("A" if payload[-1] != "A" else "B") + ":" + mac)
    _refused(good, salt="mcptasks.other")
    _refused(signing.dumps({"o": 1}, salt="mcptasks.other"))
    # Signed by us but not an object: never reaches a caller's field checks.
    _refused(signing.Signer(salt=SALT).sign_object([1, 2]))
