"""Every environment variable the settings read is documented, and every documented one is read."""

from __future__ import annotations

import re

from tests.support.servers import REPO


def test_documented_settings_match_the_ones_read() -> None:
    read = set(re.findall(r'"(MCPTASKS_[A-Z0-9_]+)"', (REPO / "mcptasks" / "settings.py").read_text()))
    documented = set(re.findall(r"`(MCPTASKS_[A-Z0-9_]+)`", (REPO / "docs" / "settings.md").read_text()))
    assert read - documented == set(), f"read but not documented in docs/settings.md: {sorted(read - documented)}"
    assert documented - read == set(), f"documented but never read: {sorted(documented - read)}"
