"""FastMCP 4 (``fastmcp-tasks`` 4.0.10, a published client of the tasks extension) against a real daphne.

The client negotiates 2026-07-28 on its own (stateless, per-request ``_meta``), declares
``io.modelcontextprotocol/tasks``, and ``call_tool`` on a task-capable tool comes back as a
task: the client polls ``tasks/get``, answers the tool's elicitation from its handler through
``tasks/update`` and returns the result inlined in the final ``tasks/get``. The driver runs in
its own virtualenv (tests/e2e/sdk/.fastmcp-venv) because it needs ``mcp`` 2.x.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import sdks
from tests.support.client import McpClient
from tests.support.servers import Proc, Stack

SDK_DIR = sdks.SDK_DIR


@pytest.fixture(scope="module")
def server(stack: Stack) -> Iterator[Proc]:
    """A server that accepts tasks/* without Mcp-Name: the client under test sends none there
    (``MCPTASKS_ERA2026_TASKS_NAME_OPTIONAL``; off by default, see docs/era2026.md)."""
    env = {"MCPTASKS_ERA2026_TASKS_NAME_OPTIONAL": "1"}
    procs = [stack.daphne(extra_env=env)]
    if stack.multi_process:
        procs.append(stack.worker(concurrency=8))
    yield procs[0]
    for p in procs:
        p.terminate(timeout=10)


@pytest.fixture(scope="module")
def fastmcp_python() -> Path:
    """The driver's interpreter, with fastmcp-tasks installed (on first use)."""
    return sdks.fastmcp_python()


def test_fastmcp_drives_a_task_with_elicitation(server: Proc, fastmcp_python: Path) -> None:
    proc = subprocess.run(
        [str(fastmcp_python), "fastmcp_drive.py", server.url],
        cwd=SDK_DIR, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"driver failed:\n{proc.stderr[-3000:]}\n{server.log_text()[-3000:]}"
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["protocol_version"] == "2026-07-28"
    # The tool's elicitation reached the client's handler, and its answer reached the tool.
    assert seen["elicitations"] == ["Delete fastmcp.txt?"]
    assert seen["transparent_text"] == "Deleted fastmcp.txt"
    assert seen["explicit_text"] == "Computed fastmcp after 0.2s"
    # The task FastMCP drove is an ordinary task of the store: a 2025-11-25 session reads it.
    with McpClient(server.url) as legacy:
        legacy.initialize()
        task = legacy.request("tasks/get", {"taskId": seen["task_id"]}).result
    assert task["status"] == "completed" and task["taskId"] == seen["task_id"]
