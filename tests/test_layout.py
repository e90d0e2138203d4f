"""Sizes that keep the tree readable (issue 26): no module over ~400 lines, no class over ~250.

Migrations are Django's; the limits allow a few lines of slack over the round numbers.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.servers import REPO

MODULE_MAX_LINES = 410
CLASS_MAX_LINES = 255


def _sources() -> list[Path]:
    return [p for app in ("mcptasks", "tenants") for p in sorted((REPO / app).rglob("*.py"))
            if "migrations" not in p.parts]


def test_no_module_is_over_about_400_lines() -> None:
    lines = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in _sources()}
    long = {name: n for name, n in lines.items() if n > MODULE_MAX_LINES}
    assert long == {}


def test_no_class_is_over_about_250_lines() -> None:
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and (n := node.end_lineno - node.lineno + 1) > CLASS_MAX_LINES:
                long[f"{path.relative_to(REPO)}:{node.name}"] = n
    assert long == {}
