"""The documented production server, uvicorn, and granian serve everything daphne does (see
docs/operations.md), and all three close open streams properly on SIGTERM.

On PostgreSQL + Redis: two web processes and two workers, the task created through one and its
notifications read through the other; on SQLite one web process with its embedded worker. The
official conformance suite also runs against uvicorn in CI (tests/support/conformance.py).
"""

from __future__ import annotations

import secrets
import signal
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from mcptasks.processes.embedded import SHUTDOWN_FORCE_AFTER_S
from tests.e2e.live_support import Listener, Pair, is_terminal_note, start_pair, status_notes, twin
from tests.support.client import McpClient
from tests.support.servers import Stack


@pytest.fixture(scope="module", params=["uvicorn", "granian"])
def pair(request: pytest.FixtureRequest, stack: Stack) -> Iterator[Pair]:
    with start_pair(stack, server=request.param) as p:
        yield p


def test_tasks_streams_and_live_notifications(pair: Pair) -> None:
    with McpClient(pair.a.url) as c:
        c.initialize()
        assert c.call("test_simple_text").result["content"][0]["text"].startswith("This is a simple text")
        listener = Listener(twin(c, pair.b.url)).start()
        listener.wait_primed()
        task = c.call_task("demo_progress", {"steps": 3, "interval_ms": 100})
        listener.until = is_terminal_note(task["taskId"])
        # Status notifications reach the session's GET stream on the other process as they happen.
        listener.wait_done()
        assert [s for s, _ in status_notes(listener.messages, task["taskId"])][-1] == "completed"
        result = c.request("tasks/result", {"taskId": task["taskId"]})
        assert result.result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
        assert c.request("tasks/get", {"taskId": task["taskId"]}).result["status"] == "completed"
        # A blocking tasks/result streams until a running task is done, then answers.
        slow = c.call_task("demo_sleep", {"ms": 300})
        answered = c.request("tasks/result", {"taskId": slow["taskId"]})
        assert answered.result["content"][0]["text"] == "Slept for 300 ms"


@pytest.mark.parametrize("server", ["uvicorn", "granian", "daphne"])
def test_sigterm_closes_open_streams_with_retry(stack: Stack, server: str) -> None:
    """Every server: streams end with a retry: hint (a clean end of body) before the process stops."""
    web = stack.web(server=server, embedded_worker=False)
    try:
        with McpClient(web.url) as c:
            c.initialize()
            h = c.headers(Accept="text/event-stream")
            h.pop("Content-Type")
            lines: list[str] = []
            with httpx.Client(timeout=20) as http, http.stream("GET", web.url, headers=h) as resp:
                assert resp.status_code == 200
                it = resp.iter_lines()
                for line in it:  # the whole priming event (it carries a retry: of its own)
                    if not line:
                        break
                web.popen.send_signal(signal.SIGTERM)
                lines.extend(it)  # a clean end of body, not a cut connection
        assert any(line.startswith("retry:") for line in lines), lines
        # The shutdown's watchdog ends a stuck process after SHUTDOWN_FORCE_AFTER_S, dumping every
        # thread's stack: wait past it, then say which happened (a 15 s wait raced it once in CI).
        try:
            web.popen.wait(SHUTDOWN_FORCE_AFTER_S + 10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{server} still running after SIGTERM; its log ends:\n{web.log_text()[-4000:]}")
        log = web.log_text()
        assert "exiting now" not in log, f"{server}'s shutdown was stuck until the watchdog; log:\n{log[-4000:]}"
        assert "closed 1 open stream(s)" in log
    finally:
        web.terminate(timeout=10)


@pytest.mark.parametrize("server", ["uvicorn", "granian", "daphne"])
def test_a_token_in_the_query_string_never_reaches_the_log(stack: Stack, server: str) -> None:
    """Started as documented, no server writes the request's query string to its log (uvicorn's
    access log would: the documented command turns it off)."""
    web = stack.web(server=server, embedded_worker=False)
    try:
        secret = secrets.token_urlsafe(24)
        with McpClient(web.url) as c:
            c.initialize()
            resp = c.http.post(f"{web.url}?access_token={secret}", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                               headers=c.headers())
            assert resp.status_code == 400
            assert c.request("ping", {}).status == 200  # a request after it is logged, if anything is
    finally:
        web.terminate(timeout=10)
    assert secret not in web.log_text()
