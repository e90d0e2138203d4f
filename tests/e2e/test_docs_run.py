"""Every command block of README.md and docs/*.md runs, verbatim, against a real ``manage.py serve``.

The blocks are extracted by tests/support/docblocks.py. Each gets ``URL`` and ``TOKEN`` (what
``serve`` printed, as the docs tell the reader to set them) and runs from a folder that looks
like a checkout (``.venv``, ``manage.py``): bash blocks with ``bash -e -o pipefail``, Python
blocks with this virtualenv's interpreter (or the one a ``run-with`` marker names), JavaScript
blocks as ``.mjs`` files under Node 22 beside the TypeScript SDK. A block passes when it exits 0
within its time limit, prints no JSON-RPC error, and prints every quoted value its comments
promise (``print(text)  # "teal"``: the output holds ``teal``). A block that cannot run here carries a
``<!-- not-run: reason -->`` marker, so an unmarked block that breaks fails this test.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import sdks
from tests.support.devserve import Serve, serve_env, start_serve
from tests.support.docblocks import Block, blocks, doc_files
from tests.support.servers import REPO

ALL_BLOCKS = [b for path in doc_files() for b in blocks(path)]
RUNNABLE = [b for b in ALL_BLOCKS if b.kind is not None and b.not_run is None]
BLOCK_TIMEOUT_S = 120
#: A JSON-RPC error object in a block's output (an answer the example did not expect).
_RPC_ERROR = re.compile(r'"error"\s*:\s*\{\s*"code"')
RUN_WITH = {"fastmcp"}
#: A promised output: ``print(...)  # "teal"`` or ``console.log(...);  // "teal"``.
_PROMISE = re.compile(r'(?:print|console\.log)\(.*\S\s+(?:#|//)\s*"([^"]+)"')


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """``manage.py serve`` as the README's first command starts it (SQLite, demo tenant, dev token)."""
    serve = start_serve(tmp_path_factory.mktemp("docs-serve"))
    try:
        serve.wait_ready()
        yield serve
    finally:
        serve.stop()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working folder that looks like the reader's checkout: ``.venv`` and ``manage.py`` are there."""
    folder = tmp_path_factory.mktemp("docs-cwd")
    (folder / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    (folder / "manage.py").symlink_to(REPO / "manage.py")
    return folder


def test_the_documentation_has_runnable_blocks_and_every_marker_says_why() -> None:
    kinds = {b.kind for b in RUNNABLE}
    assert {"bash", "python", "node"} <= kinds, kinds
    for b in ALL_BLOCKS:
        if b.not_run is not None:
            assert len(b.not_run) >= 10, f"{b.ident}: a not-run marker needs a reason"
            assert b.kind is not None, f"{b.ident}: not-run marks a block that is not a command anyway"
        if b.run_with is not None:
            assert b.run_with in RUN_WITH, f"{b.ident}: unknown run-with {b.run_with!r}"


def test_the_fence_parser_sees_markers_and_indented_blocks(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "intro\n\n<!-- not-run: serves forever -->\n```bash\nsleep inf\n```\n\n"
        "- item\n\n  ```sh\n  echo hi\n  ```\n\n```text\nout\n```\n"
    )
    found = blocks(doc)
    assert [(b.tag, b.text, b.not_run) for b in found] == [
        ("bash", "sleep inf\n", "serves forever"), ("sh", "echo hi\n", None), ("text", "out\n", None)]


def _command(block: Block, folder: Path) -> list[str]:
    if block.kind == "bash":
        return ["bash", "-e", "-o", "pipefail", "-c", block.text]
    if block.kind == "python":
        script = folder / f"example_{secrets.token_hex(4)}.py"
        script.write_text(block.text)
        python = sdks.fastmcp_python() if block.run_with == "fastmcp" else Path(sys.executable)
        return [str(python), str(script)]
    # Node resolves the SDK from node_modules next to the file: save it there, as .mjs (ESM).
    node = sdks.node_with_typescript_sdk()
    script = sdks.SDK_DIR / f"doc-example-{secrets.token_hex(4)}.mjs"
    script.write_text(block.text)
    return [str(node), str(script)]


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.ident for b in RUNNABLE])
def test_the_documented_block_runs(block: Block, dev: Serve, checkout: Path) -> None:
    env = serve_env(Path(dev.stderr_log).parent, {"URL": dev.url, "TOKEN": dev.token})
    command = _command(block, checkout)
    try:
        proc = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{block.ident} did not finish within {BLOCK_TIMEOUT_S}s (it must exit):\n{exc.stdout!r}")
    finally:
        if block.kind == "node":
            os.unlink(command[-1])
    shown = (f"{block.ident} ({block.kind}):\n--- stdout ---\n{proc.stdout[-3000:]}\n"
             f"--- stderr ---\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, shown
    assert not _RPC_ERROR.search(proc.stdout), shown
    for promised in _PROMISE.findall(block.text):
        assert promised in proc.stdout, f"{block.ident} promises {promised!r} in a comment:\n{shown}"
