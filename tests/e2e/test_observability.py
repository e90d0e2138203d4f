"""Traces across processes and structured JSON logs (issue 30, items 9 and 10).

Real processes: a daphne without embedded worker and an ``mcptasks_worker``, sharing PostgreSQL
and Redis, with ``OTEL_TRACES_EXPORTER=console`` (one JSON span per line on each process's
output) and ``MCPTASKS_LOG_FORMAT=json``.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.client import McpClient
from tests.support.requirements import require_multiprocess
from tests.support.servers import Proc, Stack
from tests.support.waiting import wait_for

TERMINAL = {"completed", "failed", "cancelled"}
OBS_ENV = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "mcptasks-e2e", "MCPTASKS_LOG_FORMAT": "json",
           "LOG_LEVEL": "DEBUG"}


@pytest.fixture(scope="module")
def procs(stack: Stack) -> Iterator[tuple[Proc, Proc]]:
    require_multiprocess()
    if not stack.multi_process:
        pytest.fail("needs PostgreSQL and Redis")
    web = stack.daphne(embedded_worker=False, extra_env=OBS_ENV)
    worker = stack.worker(concurrency=2, extra_env=OBS_ENV)
    try:
        yield web, worker
    finally:
        web.terminate(timeout=15)
        worker.terminate(timeout=15)


def spans(proc: Proc) -> list[dict[str, Any]]:
    """The spans the console exporter wrote to a process's output (one JSON object per line)."""
    out = []
    for line in proc.log_text().splitlines():
        if line.startswith('{"name"') and '"context"' in line:
            out.append(json.loads(line))
    return out


def log_lines(proc: Proc) -> list[dict[str, Any]]:
    """The JSON log lines of a process (spans excluded)."""
    out = []
    for line in proc.log_text().splitlines():
        if line.startswith('{"ts"'):
            out.append(json.loads(line))
    return out


def trace_of(span: dict[str, Any]) -> str:
    return str(span["context"]["trace_id"]).removeprefix("0x")


def run_task(client: McpClient, **call: Any) -> str:
    task_id = client.call_task("demo_sleep", {"ms": 50}, **call)["taskId"]
    wait_for("the task to end", lambda: client.request("tasks/get", {"taskId": task_id}).result["status"] in TERMINAL)
    assert client.request("tasks/result", {"taskId": task_id}).result["content"][0]["text"]
    return task_id


def test_one_trace_follows_a_task_across_web_and_worker(stack: Stack, procs: tuple[Proc, Proc]) -> None:
    web, worker = procs
    principal = "obs-" + secrets.token_hex(4)
    token = stack.token(tenant="obs", principal=principal)
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    with McpClient(web.url, token=token) as client:
        client.initialize()
        # A traceparent in params._meta is continued.
        task_id = run_task(client, meta={"traceparent": f"00-{trace_id}-{parent}-01"})

    def joined() -> Any:
        mine = [s for s in spans(web) + spans(worker) if trace_of(s) == trace_id]
        names = {s["name"] for s in mine}
        wanted = {"mcp tools/call", "mcptasks.task.claim", "mcptasks.task.notify", "mcptasks.task.result"}
        return mine if wanted <= names and any(n.startswith("mcptasks.task.run") for n in names) else None

    mine = wait_for("the task's spans in both processes", joined, timeout=20)
    web_spans = [s for s in spans(web) if trace_of(s) == trace_id]
    worker_spans = [s for s in spans(worker) if trace_of(s) == trace_id]
    assert web_spans and worker_spans  # one trace id spans both processes
    call = next(s for s in web_spans if s["name"] == "mcp tools/call")
    assert call["parent_id"] == "0x" + parent  # the client's span is the parent
    by_name = {s["name"].split(" ")[0] if s["name"].startswith("mcptasks.task.run") else s["name"]: s for s in mine}
    ours = ("mcp tools/call", "mcptasks.task.claim", "mcptasks.task.run", "mcptasks.task.notify",
            "mcptasks.task.result")
    for name in ours:
        attrs = by_name[name]["attributes"]
        assert attrs["mcptasks.tenant"] == "obs", (name, attrs)
        assert attrs["mcptasks.task_id"] == task_id, (name, attrs)
        assert re.fullmatch(r"[0-9a-f]{16}", attrs["mcptasks.principal"]), (name, attrs)
    principals = {by_name[n]["attributes"]["mcptasks.principal"] for n in ours}
    assert len(principals) == 1  # the same (hashed) principal in the web process and the worker
    assert by_name["mcp tools/call"]["attributes"]["mcptasks.tool"] == "demo_sleep"
    assert by_name["mcptasks.task.run"]["attributes"]["mcptasks.tool"] == "demo_sleep"
    # The worker's spans are children of the creating request's span, through the stored traceparent.
    claim = by_name["mcptasks.task.claim"]
    assert claim["parent_id"] == by_name["mcp tools/call"]["context"]["span_id"]
    assert claim["resource"]["attributes"]["mcptasks.role"] == "worker"
    assert call["resource"]["attributes"]["mcptasks.role"] == "web"
    # Neither the principal's name nor the token is in any span.
    for proc in (web, worker):
        text = "\n".join(json.dumps(s) for s in spans(proc))
        assert principal not in text and token not in text


def test_a_traceparent_header_is_continued(stack: Stack, procs: tuple[Proc, Proc]) -> None:
    web, worker = procs
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    with McpClient(web.url) as client:  # anonymous
        client.initialize()
        client.http.headers["traceparent"] = f"00-{trace_id}-{parent}-01"
        task_id = run_task(client)

    def worker_joined() -> Any:
        return [s for s in spans(worker) if trace_of(s) == trace_id and s["name"].startswith("mcptasks.task.run")]

    run = wait_for("the worker's run in the header's trace", worker_joined, timeout=20)[0]
    assert run["attributes"]["mcptasks.task_id"] == task_id
    server = [s for s in spans(web) if trace_of(s) == trace_id and s["parent_id"] == "0x" + parent]
    assert server, "the web process's server span continues the header's trace"


def test_a_malformed_client_traceparent_starts_a_new_trace(stack: Stack, procs: tuple[Proc, Proc]) -> None:
    web, _worker = procs
    bogus = "00-" + "0" * 32 + "-" + "1" * 16 + "-01"  # an all-zero trace id is invalid
    with McpClient(web.url) as client:
        client.initialize()
        reply = client.request("tools/list", {"_meta": {"traceparent": bogus}})
        assert "tools" in reply.result

    def listed() -> Any:
        return [s for s in spans(web) if s["name"] == "mcp tools/list"]

    assert all(trace_of(s) != "0" * 32 for s in wait_for("the tools/list span", listed))


def test_json_logs_carry_context_and_never_a_token(stack: Stack, procs: tuple[Proc, Proc]) -> None:
    web, worker = procs
    bad_token = "obsbad" + secrets.token_urlsafe(24)
    # A refused credential: opaque, and one shaped like a JWT.
    r = httpx.post(web.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                   headers={"Authorization": f"Bearer {bad_token}", "Accept": "application/json, text/event-stream"})
    assert r.status_code == 401
    jwtish = "eyJhbGciOiJIUzI1NiJ9.eyJpc3MiOiJ4In0." + secrets.token_urlsafe(20)
    r = httpx.post(web.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                   headers={"Authorization": f"Bearer {jwtish}", "Accept": "application/json, text/event-stream"})
    assert r.status_code == 401
    token = stack.token(tenant="obslog", principal="logger-" + secrets.token_hex(3))
    huge = "X" * 200_000
    with McpClient(web.url, token=token) as client:
        client.initialize()
        # A client-chosen method name of 200,000 characters reaches the (debug) request line.
        assert client.request(huge).error["code"] == -32601
        crashed = client.call_task("demo_crash", {"message": "boom-" + secrets.token_hex(3)})["taskId"]
        wait_for("the crash", lambda: client.request("tasks/get", {"taskId": crashed}).result["status"] in TERMINAL)

    def crash_line() -> Any:
        return next((line for line in log_lines(worker) if "crashed in task" in line["message"]), None)

    line = wait_for("the worker's crash log line", crash_line, timeout=15)
    assert line["task_id"] == crashed and line["tenant"] == "obslog"
    assert re.fullmatch(r"[0-9a-f]{32}", line["trace_id"] or "")
    assert "Traceback" in line["exc"]
    web_lines = log_lines(web)
    request_line = next(x for x in web_lines if x["message"].startswith("request XXXX"))
    assert request_line["tenant"] == "obslog" and re.fullmatch(r"[0-9a-f]{16}", request_line["request_id"])
    assert len(request_line["message"]) < 300
    for proc in (web, worker):
        lines = log_lines(proc)
        assert lines
        for entry in lines:
            assert {"request_id", "tenant", "task_id", "trace_id"} <= entry.keys()
        text = proc.log_text()
        assert bad_token not in text and jwtish not in text and token not in text
        assert huge not in text  # never the whole client string


@pytest.mark.parametrize("server", ["uvicorn", "granian"])
def test_other_web_servers_trace_too(stack: Stack, procs: tuple[Proc, Proc], server: str) -> None:
    _web, worker = procs
    web = stack.web(server=server, embedded_worker=False, extra_env=OBS_ENV)
    try:
        trace_id = secrets.token_hex(16)
        with McpClient(web.url) as client:
            client.initialize()
            client.http.headers["traceparent"] = f"00-{trace_id}-{secrets.token_hex(8)}-01"
            task_id = run_task(client)
        calls = wait_for(f"{server}'s tools/call span", lambda: [
            s for s in spans(web) if s["name"] == "mcp tools/call" and trace_of(s) == trace_id])
        assert calls[0]["attributes"]["mcptasks.task_id"] == task_id
        assert wait_for(f"the worker's run in {server}'s trace", lambda: [
            s for s in spans(worker) if trace_of(s) == trace_id and s["name"].startswith("mcptasks.task.run")])
    finally:
        web.terminate(timeout=15)


def test_serve_traces_with_its_embedded_worker(tmp_path: Any) -> None:
    from tests.support.devserve import start_serve

    serve = start_serve(tmp_path / "serve", extra_env={"OTEL_TRACES_EXPORTER": "console"})
    try:
        serve.wait_ready()
        trace_id = secrets.token_hex(16)
        with McpClient(serve.url, token=serve.token) as client:
            client.initialize()
            task_id = run_task(client, meta={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})

        def run_span() -> Any:
            for line in list(serve.lines):
                if line.startswith('{"name"') and '"context"' in line:
                    s = json.loads(line)
                    if trace_of(s) == trace_id and s["name"].startswith("mcptasks.task.run"):
                        return s
            return None

        run = wait_for("the embedded worker's run span", run_span)
        assert run["attributes"]["mcptasks.task_id"] == task_id
        assert run["resource"]["attributes"]["mcptasks.role"] == "serve"
    finally:
        serve.stop()


def test_a_2026_request_is_traced_into_the_worker(procs: tuple[Proc, Proc]) -> None:
    from tests.support.client2026 import TASKS_EXTENSION, Client2026

    web, worker = procs
    trace_id = secrets.token_hex(16)
    caps = {"elicitation": {}, "sampling": {}, "extensions": {TASKS_EXTENSION: {}}}
    with Client2026(web.url, capabilities=caps) as c26:
        c26.http.headers["traceparent"] = f"00-{trace_id}-{secrets.token_hex(8)}-01"
        c26.result("tools/call", {"name": "demo_sleep", "arguments": {"ms": 20}})

    def joined() -> Any:
        call = [s for s in spans(web) if s["name"] == "mcp tools/call" and trace_of(s) == trace_id]
        run = [s for s in spans(worker) if trace_of(s) == trace_id and s["name"].startswith("mcptasks.task.run")]
        return (call, run) if call and run else None

    call, run = wait_for("the 2026 call's spans in both processes", joined)
    assert call[0]["attributes"]["mcptasks.tool"] == "demo_sleep"
    assert run[0]["attributes"]["mcptasks.tool"] == "demo_sleep"
