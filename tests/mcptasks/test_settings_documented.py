"""Settings are defined once: every variable read is documented, the generated tables are current."""

from __future__ import annotations

import re

from mcptasks.conf import AppSettings
from mcptasks.settings_doc import DOC, render
from tenants.conf import TenantSettings
from tenants.typed_settings import variables
from tests.support.servers import REPO


def test_documented_settings_match_the_ones_read() -> None:
    literal = set(re.findall(r'"(MCPTASKS_[A-Z0-9_]+)"', (REPO / "mcptasks" / "settings.py").read_text()))
    read = literal | set(variables(AppSettings)) | set(variables(TenantSettings))
    documented = set(re.findall(r"`(MCPTASKS_[A-Z0-9_]+)`", DOC.read_text()))
    assert read - documented == set(), f"read but not documented in docs/settings.md: {sorted(read - documented)}"
    assert documented - read == set(), f"documented but never read: {sorted(documented - read)}"


def test_generated_tables_are_current() -> None:
    current = DOC.read_text()
    assert render(current) == current, "run: .venv/bin/python -m mcptasks.settings_doc"


def test_each_app_setting_is_read_by_the_loop_not_by_hand() -> None:
    # settings.py names no app setting itself: the loop over the definitions reads them all.
    literal = set(re.findall(r'"(MCPTASKS_[A-Z0-9_]+)"', (REPO / "mcptasks" / "settings.py").read_text()))
    assert literal & (set(variables(AppSettings)) | set(variables(TenantSettings))) == set()
