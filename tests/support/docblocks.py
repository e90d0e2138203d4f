"""The fenced code blocks of the documentation, for the test that runs them.

Every block tagged as a command or a program (``bash``, ``sh``, ``shell``, ``python``, ``js``,
``mjs``, ``javascript``) in ``README.md`` and ``docs/*.md`` is run, unless the line right before
its fence (blank lines aside) is a marker::

    <!-- not-run: why this block cannot run in a test -->

A reason is required. ``<!-- run-with: NAME -->`` picks another interpreter for a block (e.g.
``fastmcp``: the FastMCP 4 virtualenv). Blocks with any other tag (``text``, ``json``, ``ini``) or
none (diagrams) are not commands and are not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.servers import REPO

#: Tags of blocks that are run, by the kind of runner.
KINDS = {
    "bash": "bash", "sh": "bash", "shell": "bash",
    "python": "python", "py": "python",
    "js": "node", "mjs": "node", "javascript": "node",
}

_FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>```+)(?P<tag>[^`\s]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<key>not-run|run-with):\s*(?P<value>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its tag, its text and its marker."""

    path: Path
    line: int  # 1-based line of the opening fence
    tag: str
    text: str
    not_run: str | None = None  # the reason, when marked not-run
    run_with: str | None = None

    @property
    def kind(self) -> str | None:
        """``bash``, ``python`` or ``node`` for a block to run; None for anything else."""
        return KINDS.get(self.tag.lower())

    @property
    def ident(self) -> str:
        """``docs/clients.md:26`` (used as the test id)."""
        return f"{self.path.relative_to(REPO)}:{self.line}"


def doc_files() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` in order, with the marker that precedes it, if any."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence, tag = opening["indent"], opening["fence"], opening["tag"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        marker = _preceding_marker(lines, i)
        out.append(Block(
            path=path, line=i + 1, tag=tag, text="\n".join(body) + "\n",
            not_run=marker[1] if marker and marker[0] == "not-run" else None,
            run_with=marker[1] if marker and marker[0] == "run-with" else None,
        ))
        i = j + 1
    return out


def _preceding_marker(lines: list[str], fence_index: int) -> tuple[str, str] | None:
    k = fence_index - 1
    while k >= 0 and not lines[k].strip():
        k -= 1
    if k < 0:
        return None
    found = _MARKER.match(lines[k])
    return (found["key"], found["value"]) if found else None
