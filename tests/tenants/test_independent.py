"""The tenants app stands on its own: it never imports mcptasks (mcptasks builds on it)."""

from __future__ import annotations

import ast

from tests.support.servers import REPO


def test_tenants_never_imports_mcptasks() -> None:
    offenders = []
    for path in sorted((REPO / "tenants").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == "mcptasks"]
    assert offenders == []


def test_no_import_cycles_inside_tenants() -> None:
    """Module-level imports between tenants modules form no cycle (auth <-> jwt_issuers was one)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((REPO / "tenants").glob("*.py")):
        deps: set[str] = set()
        for node in ast.parse(path.read_text()).body:  # module level only: lazy imports are fine
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps.update(a.name for a in node.names)
        graph[path.stem] = deps

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for dep in graph.get(start, ()):
            if dep == goal or (dep not in seen and reaches(dep, goal, seen | {dep})):
                return True
        return False

    assert [m for m in graph if reaches(m, m, {m})] == []
