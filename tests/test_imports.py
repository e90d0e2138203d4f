"""Import direction: the layers of docs/architecture.md, read from the source.

Every import statement counts, at module level, inside a function or under ``if TYPE_CHECKING:``:
a lazy import is still a dependency. The rules:

- the protocol layer imports no Django (directly, or transitively when imported);
- ``tenants`` never imports ``mcptasks``;
- a package imports only itself and the packages of lower layers (``LAYERS``), never upward and
  never a sibling of its own layer;
- the HTTP layer (``mcptasks.endpoint``) touches no models, ORM or SQL;
- no import cycles between modules.

Each check is also shown to catch what it forbids, in a synthetic tree (the last tests).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.servers import REPO

#: The layers, lowest first. A module belongs to the longest prefix listed here; it may import
#: modules of its own package and of any lower layer. Packages of one layer may not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("mcptasks.protocol",),
    ("tenants.infra",),
    ("tenants",),
    ("mcptasks.conf",),
    ("mcptasks.observability", "mcptasks.hardening", "mcptasks.db"),
    ("mcptasks.models", "mcptasks.tools"),
    ("mcptasks.audit",),
    ("mcptasks.streams",),
    ("mcptasks.tasks",),
    ("mcptasks.methods", "mcptasks.worker"),
    ("mcptasks.endpoint", "mcptasks.console"),
    ("mcptasks.processes",),
    # Django's wiring and the process entry points sit on top: they may import anything, each other too.
    ("mcptasks.apps", "mcptasks.asgi", "mcptasks.urls", "mcptasks.checks", "mcptasks.settings",
     "mcptasks.settings_doc", "mcptasks.management", "mcptasks.migrations", "mcptasks.registry",
     "mcptasks.demo", "mcptasks.conformance", "mcptasks.testing", "mcptasks"),
)

#: What the HTTP layer may not touch: models, the ORM and SQL.
HTTP_FORBIDDEN = ("mcptasks.models", "django.db", "mcptasks.db", "psycopg")


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module at ``path`` under ``root``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (annotations only, never executed)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            found.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return found


def imports_of(path: Path, root: Path, modules: dict[str, Path] | None = None, *,
               runtime_only: bool = False) -> set[str]:
    """Every module ``path`` imports, relative imports resolved (``from a import b``: ``a`` and ``a.b``).

    Given the tree's ``modules``, ``from a import b`` yields only ``a.b`` where that is a module
    (``from mcptasks import conf`` depends on ``mcptasks.conf``, not on the package ``mcptasks``).
    ``runtime_only``: leave out imports under ``if TYPE_CHECKING:``.
    """
    name = module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    tree = ast.parse(path.read_text())
    skip = _type_only(tree) if runtime_only else set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            named = {f"{module}.{a.name}" for a in node.names}
            if modules is not None and named <= set(modules):
                found.update(named)
            else:
                found.add(module)
                found.update(named)
    return found


def sources(root: Path) -> dict[str, Path]:
    """The modules of both apps under ``root`` (migrations aside: Django writes them)."""
    return {module_name(p, root): p for app in ("mcptasks", "tenants") for p in sorted((root / app).rglob("*.py"))
            if "migrations" not in p.parts}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def home(module: str) -> tuple[int, str] | None:
    """(layer index, package) of ``module``: the longest prefix of ``LAYERS`` it falls within."""
    best: tuple[int, str] | None = None
    for index, layer in enumerate(LAYERS):
        for prefix in layer:
            if _within(module, prefix) and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    return best


def layer_violations(root: Path) -> list[str]:
    """Imports that go upward, sideways within a layer, or from ``tenants`` into ``mcptasks``."""
    modules = sources(root)
    found = []
    for name, path in modules.items():
        mine = home(name)
        if mine is None:
            continue
        for target in sorted(imports_of(path, root, modules)):
            if target not in modules:
                continue
            theirs = home(target)
            if theirs is None or theirs[1] == mine[1]:
                continue
            if _within(name, "tenants") and _within(target, "mcptasks"):
                found.append(f"{name} -> {target} (tenants never imports mcptasks)")
            elif theirs[0] > mine[0]:
                found.append(f"{name} -> {target} (upward: {mine[1]} is below {theirs[1]})")
            elif theirs[0] == mine[0] < len(LAYERS) - 1:
                found.append(f"{name} -> {target} (sideways within one layer)")
    return found


def forbidden_imports(path: Path, root: Path, forbidden: tuple[str, ...]) -> list[str]:
    """The imports of ``path`` that are, or are inside, one of the ``forbidden`` modules."""
    return sorted(m for m in imports_of(path, root) if any(_within(m, f) for f in forbidden))


def cycles(root: Path) -> list[list[str]]:
    """Import cycles between modules (lazy imports included), each reported once from its smallest member.

    Imports under ``if TYPE_CHECKING:`` do not count here (a model and its QuerySet name each
    other in annotations only); the layer check still counts them.
    """
    modules = sources(root)
    graph = {}
    for name, path in modules.items():
        deps = set()
        for target in imports_of(path, root, modules, runtime_only=True):
            if target in modules and target != name and not _within(name, target):
                deps.add(target)
        graph[name] = deps
    found = []
    for start in sorted(modules):
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, trail = stack.pop()
            for dep in sorted(graph[node]):
                if dep == start:
                    if start == min(trail):
                        found.append([*trail, start])
                elif dep not in seen and dep > start:
                    seen.add(dep)
                    stack.append((dep, [*trail, dep]))
    return found


# --- the rules -----------------------------------------------------------------------------------


def test_every_module_has_a_layer() -> None:
    assert [m for m in sources(REPO) if home(m) is None] == []


def test_imports_go_down_the_layers() -> None:
    assert layer_violations(REPO) == []


def test_the_http_layer_touches_no_models_orm_or_sql() -> None:
    offenders = {module_name(p, REPO): forbidden_imports(p, REPO, HTTP_FORBIDDEN)
                 for p in sorted((REPO / "mcptasks" / "endpoint").rglob("*.py"))}
    assert {m: found for m, found in offenders.items() if found} == {}


def test_no_import_cycles() -> None:
    assert cycles(REPO) == []


def test_the_protocol_layer_imports_no_django() -> None:
    offenders = {module_name(p, REPO): forbidden_imports(p, REPO, ("django", "channels"))
                 for p in sorted((REPO / "mcptasks" / "protocol").rglob("*.py"))}
    assert {m: found for m, found in offenders.items() if found} == {}


@pytest.mark.processes(reason="imports the protocol package in a fresh interpreter (python -c)")
def test_importing_every_protocol_module_loads_no_django() -> None:
    """Transitively too: in a fresh interpreter, the whole protocol package pulls in no Django."""
    names = [module_name(p, REPO) for p in sorted((REPO / "mcptasks" / "protocol").rglob("*.py"))]
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({n!r})\n" for n in names) + (
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'channels')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- the checks catch what they forbid ------------------------------------------------------------


def _synthetic(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, source in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return tmp_path


def test_the_checks_catch_forbidden_imports(tmp_path: Path) -> None:
    root = _synthetic(tmp_path, {
        "mcptasks/__init__.py": "",
        "mcptasks/protocol/__init__.py": "",
        "mcptasks/protocol/bad.py": """
            def later():
                from django.db import connection  # even a lazy one
                return connection
        """,
        "mcptasks/models.py": "",
        "mcptasks/tasks/__init__.py": "",
        # upward, lazily: the engine reaching into a method table
        "mcptasks/tasks/selectors.py": """
            def f():
                from mcptasks.methods import era2025
                return era2025
        """,
        "mcptasks/methods/__init__.py": "",
        "mcptasks/methods/era2025.py": "from mcptasks.tasks import selectors\n",
        # sideways: a method table importing the worker
        "mcptasks/methods/era2026.py": "from mcptasks.worker import loop\n",
        "mcptasks/worker/__init__.py": "",
        "mcptasks/worker/loop.py": "",
        # the HTTP layer touching models and SQL
        "mcptasks/endpoint/__init__.py": "",
        "mcptasks/endpoint/consumer.py": """
            from django.db import connection
            from mcptasks.models import Task
        """,
        "tenants/__init__.py": "",
        "tenants/auth.py": "from mcptasks.tasks import selectors\n",
    })
    assert forbidden_imports(root / "mcptasks/protocol/bad.py", root, ("django",)) == [
        "django.db", "django.db.connection"]
    assert layer_violations(root) == [
        "mcptasks.methods.era2026 -> mcptasks.worker.loop (sideways within one layer)",
        "mcptasks.tasks.selectors -> mcptasks.methods.era2025 (upward: mcptasks.tasks is below mcptasks.methods)",
        "tenants.auth -> mcptasks.tasks.selectors (tenants never imports mcptasks)",
    ]
    assert forbidden_imports(root / "mcptasks/endpoint/consumer.py", root, HTTP_FORBIDDEN) == [
        "django.db", "django.db.connection", "mcptasks.models", "mcptasks.models.Task"]
    # tasks.selectors -> methods.era2025 -> tasks.selectors, found once.
    assert cycles(root) == [["mcptasks.methods.era2025", "mcptasks.tasks.selectors", "mcptasks.methods.era2025"]]
