"""Import direction: the protocol layer imports no Django, and the 2026-07-28 request path never
imports or receives the HTTP consumer (it returns replies the consumer writes).

The checks read the source (every import statement, at module level or inside a function or an
``if TYPE_CHECKING:`` block), and each is shown to catch a forbidden import in a synthetic module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.servers import REPO

CONSUMER = "mcptasks.transport.consumer"


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module at ``path`` under ``root``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path, *, top_level_only: bool = False) -> set[str]:
    """Every module ``path`` imports, relative imports resolved (``from a import b``: ``a`` and ``a.b``).

    ``top_level_only``: statements run at import time (module level, including ``if`` blocks
    such as ``if TYPE_CHECKING:``), not those inside functions.
    """
    name = module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    tree = ast.parse(path.read_text())
    nodes: list[ast.AST] = []
    if top_level_only:
        pending: list[ast.stmt] = list(tree.body)
        while pending:
            node = pending.pop()
            nodes.append(node)
            if isinstance(node, ast.If | ast.Try):
                pending += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
    else:
        nodes = list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


def forbidden_imports(path: Path, root: Path, forbidden: tuple[str, ...]) -> list[str]:
    """The imports of ``path`` that are, or are inside, one of the ``forbidden`` modules."""
    return sorted(m for m in imports_of(path, root) if any(m == f or m.startswith(f + ".") for f in forbidden))


def receives_consumer(path: Path) -> list[str]:
    """Functions of ``path`` with a parameter that is the consumer (by name or annotation)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if arg.arg == "consumer" or "McpConsumer" in annotation:
                    found.append(f"{node.name}({arg.arg})")
    return found


def cycles_through(root: Path, package: str, members: tuple[str, ...]) -> list[list[str]]:
    """Import-time cycles among the modules of ``package`` that pass through one of ``members``."""
    modules = {module_name(p, root): p for p in (root / package).rglob("*.py") if "migrations" not in p.parts}
    graph = {name: {m for m in imports_of(p, root, top_level_only=True) if m in modules and m != name}
             for name, p in modules.items()}
    found = []
    for start in sorted(modules):
        if not any(start == m or start.startswith(m + ".") for m in members):
            continue
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, trail = stack.pop()
            for dep in sorted(graph[node]):
                if dep == start:
                    found.append([*trail, start])
                elif dep not in seen:
                    seen.add(dep)
                    stack.append((dep, [*trail, dep]))
    return found


# --- the rules -----------------------------------------------------------------------------------


def test_the_protocol_layer_imports_no_django() -> None:
    offenders = {module_name(p, REPO): forbidden_imports(p, REPO, ("django", "channels"))
                 for p in sorted((REPO / "mcptasks" / "protocol").rglob("*.py"))}
    assert {m: found for m, found in offenders.items() if found} == {}


def test_importing_every_protocol_module_loads_no_django() -> None:
    """Transitively too: in a fresh interpreter, the whole protocol package pulls in no Django."""
    names = [module_name(p, REPO) for p in sorted((REPO / "mcptasks" / "protocol").rglob("*.py"))]
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({n!r})\n" for n in names) + (
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'channels')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_2026_path_neither_imports_nor_receives_the_consumer() -> None:
    for path in sorted((REPO / "mcptasks" / "era2026").rglob("*.py")):
        assert forbidden_imports(path, REPO, (CONSUMER,)) == [], path.name
        assert receives_consumer(path) == [], path.name


def test_the_http_layer_and_the_2026_path_are_in_no_import_cycle() -> None:
    assert cycles_through(REPO, "mcptasks", ("mcptasks.transport", "mcptasks.era2026.transport")) == []


# --- the checks catch what they forbid ------------------------------------------------------------


def _synthetic(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, source in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return tmp_path


def test_the_checks_catch_a_forbidden_import(tmp_path: Path) -> None:
    root = _synthetic(tmp_path, {
        "mcptasks/__init__.py": "",
        "mcptasks/protocol/__init__.py": "",
        "mcptasks/protocol/bad.py": """
            def later():
                from django.db import connection  # even a lazy one
                return connection
        """,
        "mcptasks/era2026/__init__.py": "",
        "mcptasks/era2026/transport.py": """
            from __future__ import annotations
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from ..transport.consumer import McpConsumer

            async def serve(consumer: McpConsumer, raw: object) -> None: ...
        """,
        "mcptasks/transport/__init__.py": "",
        "mcptasks/transport/consumer.py": "from ..era2026 import transport\n",
    })
    assert forbidden_imports(root / "mcptasks/protocol/bad.py", root, ("django",)) == ["django.db",
                                                                                        "django.db.connection"]
    era = root / "mcptasks/era2026/transport.py"
    assert forbidden_imports(era, root, (CONSUMER,)) == [CONSUMER, f"{CONSUMER}.McpConsumer"]
    assert receives_consumer(era) == ["serve(consumer)"]
    # The consumer -> era2026 -> consumer cycle (through the TYPE_CHECKING import) is found.
    assert cycles_through(root, "mcptasks", ("mcptasks.era2026.transport",)) == [
        ["mcptasks.era2026.transport", CONSUMER, "mcptasks.era2026.transport"],
    ]
