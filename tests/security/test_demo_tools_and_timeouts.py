"""Issue 25 item 6: no tool may hold a worker slot without bound.

The demo tools (``demo_sleep`` for as long as the caller likes) are off unless a deployment
turns them on, their arguments are bounded, and every tool run has a time limit, the default
one when the tool declares none.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from mcptasks.models import TaskStatus
from mcptasks.tools.registry import Registry, ToolInputError
from mcptasks.worker.backend import WorkerBackend
from mcptasks.worker.loop import Worker
from tests.support.factories import demo_tool, task_row
from tests.support.servers import REPO

PROBE = (
    "import json, django; django.setup(); from django.conf import settings; "
    "from django.core.checks import run_checks; "
    "print(json.dumps({'apps': settings.INSTALLED_APPS, 'checks': [m.id for m in run_checks()]}))"
)


def _probe(env: dict[str, str], tmp: Path) -> dict[str, Any]:
    """The installed apps and system-check ids of a fresh process on ``env`` (nothing inherited)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("MCPTASKS_") and k not in {
        "DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG"}}
    base.update({"DJANGO_SETTINGS_MODULE": "mcptasks.settings", "MCPTASKS_VAR_DIR": str(tmp)}, **env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=base, cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.processes(reason="reads the settings in a fresh interpreter (python -c)")
def test_demo_tools_are_off_unless_enabled_and_warned_about_outside_debug(tmp_path: Path) -> None:
    default = _probe({}, tmp_path)
    assert "mcptasks.demo" not in default["apps"]
    assert "mcptasks.W006" not in default["checks"]
    enabled = _probe({"MCPTASKS_DEMO_TOOLS": "1"}, tmp_path)
    assert "mcptasks.demo" in enabled["apps"]
    assert "mcptasks.W006" in enabled["checks"]  # on while DEBUG is off: warned
    debug = _probe({"MCPTASKS_DEMO_TOOLS": "1", "DEBUG": "1"}, tmp_path)
    assert "mcptasks.demo" in debug["apps"] and "mcptasks.W006" not in debug["checks"]


@pytest.mark.parametrize(("tool", "arguments"), [
    ("demo_sleep", {"ms": 24 * 3600 * 1000}),
    ("demo_sleep", {"ms": -5}),
    ("demo_sync_sleep", {"ms": 24 * 3600 * 1000}),
    ("demo_progress", {"steps": 3000, "interval_ms": 0}),
    ("demo_progress", {"steps": 5, "interval_ms": 24 * 3600 * 1000}),
    ("demo_fail", {"message": "x" * 100_000}),
    ("demo_crash", {"message": "x" * 100_000}),
    ("demo_ask", {"question": "x" * 100_000}),
    ("demo_sample", {"prompt": "x" * 100_000}),
])
def test_demo_tool_arguments_are_bounded(tool: str, arguments: dict[str, Any]) -> None:
    with pytest.raises(ToolInputError):
        demo_tool(tool).validate_arguments(arguments)


def test_demo_tool_arguments_within_bounds_still_pass() -> None:
    assert demo_tool("demo_sleep").validate_arguments({"ms": 600_000}) == {"ms": 600_000}
    assert demo_tool("demo_progress").validate_arguments({"steps": 100, "interval_ms": 0})["steps"] == 100


reg = Registry()


@reg.tool(task_support="optional")
async def sec_forever() -> str:
    """Declares no timeout and would sleep far longer than the test allows."""
    await asyncio.sleep(3)
    return "finished"


@reg.tool(task_support="optional")
def sec_forever_sync() -> str:
    """The same, as a synchronous tool (its thread cannot be interrupted)."""
    import time

    time.sleep(1.5)
    return "finished"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("tool", ["sec_forever", "sec_forever_sync"])
async def test_a_tool_without_a_declared_timeout_gets_the_default_one(settings: Any, tool: str) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "TOOL_DEFAULT_TIMEOUT_S": 0.3}
    row = await sync_to_async(task_row)(tool)
    worker = Worker(concurrency=1, worker_id="sec-timeout", registry_=reg, run_cleanup=False)
    try:
        outcome = await asyncio.wait_for(worker._run(row, WorkerBackend(worker, row)), 10)
    finally:
        worker.tool_executor.shutdown(wait=True)
        await sync_to_async(lambda: connection.close())()
    assert outcome is not None
    assert outcome.status == TaskStatus.FAILED
    assert outcome.message == f"Tool {tool} timed out after 0.3s"
    assert outcome.error == {"code": -32603, "message": outcome.message}
