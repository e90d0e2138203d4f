"""``manage.py serve`` as a real process: shutdown with a sync tool running, a busy port, a stable token."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.client import McpClient
from tests.support.devserve import start_serve

GRACE_S = 2.0
#: How long the stubborn tool of the Ctrl-C test runs (a shutdown that waited for it takes this long).
TOOL_S = 60.0
#: The testing app's tools (test_stubborn: a sync tool that ignores cancellation).
TESTING = {"MCPTASKS_EXTRA_APPS": "mcptasks.testing", "MCPTASKS_WORKER_SHUTDOWN_GRACE_S": str(GRACE_S)}


def _task_row(var_dir: Path, task_id: str) -> dict[str, Any]:
    with sqlite3.connect(var_dir / "mcptasks.sqlite3", timeout=10) as db:
        db.row_factory = sqlite3.Row
        row = db.execute(
            "SELECT status, worker_id, lease_expires_at, attempt FROM mcptasks_task WHERE task_id = ?", (task_id,)
        ).fetchone()
    assert row is not None
    return dict(row)


def test_sigterm_with_a_sync_tool_running_drains_hands_back_and_exits(tmp_path: Path) -> None:
    serve = start_serve(tmp_path, extra_env=TESTING)
    try:
        serve.wait_ready()
        with McpClient(serve.url, token=serve.token) as c:
            c.initialize()
            task_id = c.call_task("test_stubborn", {"key": "k", "ms": 60_000})["taskId"]
        deadline = time.monotonic() + 20
        while _task_row(tmp_path, task_id)["worker_id"] is None:  # the embedded worker has it
            assert time.monotonic() < deadline, serve.output()
            time.sleep(0.1)
        started = time.monotonic()
        code = serve.stop(timeout=GRACE_S + 15)
        took = time.monotonic() - started
    finally:
        serve.stop(timeout=5)
    out = serve.output()
    # It exits within its grace period (plus start-up of the shutdown), not when the tool ends (60 s).
    assert took < GRACE_S + 10, (took, out)
    assert code == 0, out
    # ...and says so.
    assert "draining 1 running task" in out and "handed back 1 task" in out, out
    # The task is free for the next worker: no lease, no owner, still working (not "lost").
    row = _task_row(tmp_path, task_id)
    assert row["status"] == "working" and row["worker_id"] is None and row["lease_expires_at"] is None, row

    # A restarted serve takes it over as a fresh attempt (the interrupted one did not count), and
    # prints the same dev token as before (still valid, so not minted again).
    first_token = serve.token
    again = start_serve(tmp_path, port=serve.port, extra_env=TESTING)
    try:
        again.wait_ready()
        assert again.token == first_token
        deadline = time.monotonic() + 20
        while _task_row(tmp_path, task_id)["attempt"] < 2:
            assert time.monotonic() < deadline, again.output()
            time.sleep(0.1)
        assert _task_row(tmp_path, task_id)["status"] == "working"
        with McpClient(again.url, token=again.token) as c:
            c.initialize()
            assert c.request("tasks/get", {"taskId": task_id}).result["status"] == "working"
    finally:
        again.stop(timeout=GRACE_S + 15)


def test_ctrl_c_drains_and_hands_back_the_same_way(tmp_path: Path) -> None:
    serve = start_serve(tmp_path, extra_env=TESTING)
    try:
        serve.wait_ready()
        with McpClient(serve.url, token=serve.token) as c:
            c.initialize()
            task_id = c.call_task("test_stubborn", {"key": "k", "ms": int(TOOL_S * 1000)})["taskId"]
        deadline = time.monotonic() + 20
        while _task_row(tmp_path, task_id)["worker_id"] is None:
            assert time.monotonic() < deadline, serve.output()
            time.sleep(0.1)
        started = time.monotonic()
        serve.stop(signal.SIGINT, timeout=TOOL_S - 15)
        took = time.monotonic() - started
    finally:
        serve.stop(timeout=5)
    out = serve.output()
    # Not waiting for the tool means well under its 60 s. The margin is wide: on a loaded 2-core
    # CI machine daphne's own shutdown took 17 s once (the process exited; it did not wait).
    assert took < TOOL_S - 20, (took, out)
    assert "handed back 1 task" in out, out
    row = _task_row(tmp_path, task_id)
    assert row["worker_id"] is None and row["lease_expires_at"] is None, row


def test_a_busy_port_fails_before_any_banner(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        serve = start_serve(tmp_path, port=port)
        try:
            code = serve.popen.wait(60)
        finally:
            serve.stop(timeout=5)
    out = serve.output()
    assert code != 0, out
    # Nothing that looks like a running server, and a clear reason that names the port and the way out.
    for promise in ("serving", "MCP URL", "Dev token", "Operator console"):
        assert promise not in out, out
    assert f"127.0.0.1:{port}" in out and "in use" in out and "--port" in out, out
    assert "Traceback" not in out, out


def test_the_port_comes_from_the_port_variable(tmp_path: Path) -> None:
    from tests.support.servers import free_port

    port = free_port()
    serve = start_serve(tmp_path, port=port, port_variable=True)
    try:
        serve.wait_ready()
        assert serve.url == f"http://127.0.0.1:{port}/mcp"
        # Development serves FastMCP 4 (no Mcp-Name on tasks/*) as it is, and says so.
        assert serve.wait_for_line("2026-07-28 clients: tasks/get|update|cancel accepted without Mcp-Name")
    finally:
        serve.stop()


def test_serve_keeps_refusing_a_missing_mcp_name_when_told_to(tmp_path: Path) -> None:
    serve = start_serve(tmp_path, extra_env={"MCPTASKS_ERA2026_TASKS_NAME_OPTIONAL": "0"})
    try:
        serve.wait_ready()
        with McpClient(serve.url, token=serve.token) as c:
            c.initialize()
            task_id = c.call_task("demo_sleep", {"ms": 10})["taskId"]
        headers = {
            "Authorization": f"Bearer {serve.token}", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tasks/get",
        }
        meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": task_id, "_meta": meta}}
        assert httpx.post(serve.url, json=body, headers=headers).status_code == 400
        assert not any("accepted without Mcp-Name" in line for line in serve.lines)
    finally:
        serve.stop()


def test_a_shutdown_stuck_behind_a_tool_thread_is_forced() -> None:
    """A process whose only work left is a sync tool thread (already handed back) does not wait
    for it: the shutdown watchdog ends it (CI: `serve` waited a minute for such a thread), after
    writing every thread's stack to its log."""
    code = (
        "import django, threading, time; django.setup(); from mcptasks.processes import embedded as runtime; "
        "threading.Thread(target=time.sleep, args=(60,)).start(); "
        "w = threading.Timer(0.5, runtime._force_exit); w.daemon = True; w.start()"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                          env={**os.environ, "DJANGO_SETTINGS_MODULE": "mcptasks.settings"})
    assert time.monotonic() - started < 30, done.stderr
    assert done.returncode == 0, done.stderr
    assert "exiting now" in done.stderr
    # What held the process is in its log: every thread's stack, the sleeping one's included.
    assert "(most recent call first)" in done.stderr and "threading.py" in done.stderr, done.stderr
