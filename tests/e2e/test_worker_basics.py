"""Worker behaviour seen through HTTP, on every backend.

On SQLite the tools run in daphne's embedded worker (``manage.py serve`` mode); on PostgreSQL +
Redis in a separate ``mcptasks_worker`` process (the ``server`` fixture starts one). Either way
the client sees the same thing: progress with its token, status messages, timeouts, cancellation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.support.client import McpClient
from tests.support.servers import FAST_SETTINGS
from tests.support.waiting import wait_for as shared_wait_for

TERMINAL = {"completed", "failed", "cancelled"}
HEARTBEAT_S = float(FAST_SETTINGS["MCPTASKS_WORKER_HEARTBEAT_S"])


def wait_for(what: str, check: Callable[[], Any], timeout: float = 15.0, every: float = 0.05) -> Any:
    """The shared poller with this module's shorter default deadline."""
    return shared_wait_for(what, check, timeout=timeout, every=every)


def get(client: McpClient, task_id: str) -> dict[str, Any]:
    return client.request("tasks/get", {"taskId": task_id}).result  # type: ignore[no-any-return]


def test_progress_reaches_requestor_with_original_token(client: McpClient) -> None:
    reply = client.call("demo_progress", {"steps": 3, "interval_ms": 20}, meta={"progressToken": "tok-7"})
    assert reply.result["content"][0]["text"] == "Completed 3 steps"
    progress = [n["params"] for n in reply.notifications if n["method"] == "notifications/progress"]
    assert [p["progress"] for p in progress] == [1, 2, 3]
    assert {p["progressToken"] for p in progress} == {"tok-7"}
    assert progress[-1]["total"] == 3 and progress[-1]["message"] == "step 3 of 3"


def test_status_message_is_seen_by_tasks_get(client: McpClient) -> None:
    tid = client.call_task("demo_progress", {"steps": 4, "interval_ms": 300})["taskId"]
    seen = wait_for("a status message", lambda: (get(client, tid).get("statusMessage") or "").startswith("step"))
    assert seen
    done = wait_for("the task to end", lambda: (t := get(client, tid))["status"] in TERMINAL and t)
    assert done["status"] == "completed"
    assert done["statusMessage"] == "step 4 of 4"


def test_tool_timeout_fails_the_task_with_a_status_message(client: McpClient) -> None:
    tid = client.call_task("test_timeout", {"ms": 5000})["taskId"]
    done = wait_for("the timeout", lambda: (t := get(client, tid))["status"] in TERMINAL and t)
    assert done["status"] == "failed"
    assert done["statusMessage"] == "Tool test_timeout timed out after 0.5s"
    err = client.request("tasks/result", {"taskId": tid}).error
    assert "timed out" in err["message"]


def test_cancelled_async_tool_stays_cancelled(client: McpClient) -> None:
    tid = client.call_task("demo_sleep", {"ms": 3000})["taskId"]
    assert client.request("tasks/cancel", {"taskId": tid}).result["status"] == "cancelled"
    # A later call runs at once (the cancelled tool freed its slot) and the task stays cancelled.
    assert client.call("demo_sleep", {"ms": 10}).result["content"][0]["text"] == "Slept for 10 ms"
    assert get(client, tid)["status"] == "cancelled"
    err = client.request("tasks/result", {"taskId": tid}).error
    assert "cancel" in err["message"].lower()


def test_sync_tool_cancellation_is_seen_by_the_tool(client: McpClient) -> None:
    tid = client.call_task("demo_sync_sleep", {"ms": 20000})["taskId"]
    t0 = time.monotonic()
    assert client.request("tasks/cancel", {"taskId": tid}).result["status"] == "cancelled"
    # A plain call after it is served at once: the worker is not stuck behind the sync tool.
    reply = client.call("demo_sleep", {"ms": 10})
    assert reply.result["content"][0]["text"] == "Slept for 10 ms"
    assert time.monotonic() - t0 < 5
    assert get(client, tid)["status"] == "cancelled"
