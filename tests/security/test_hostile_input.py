"""Items 6, 8, 9 and 11: hostile task ids, deep JSON, NUL characters, tokens in URLs, the dev key."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mcptasks.protocol import jsonrpc
from mcptasks.protocol.errors import McpError
from tests.support.client import ACCEPT_BOTH, McpClient
from tests.support.servers import REPO, Proc, Stack
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def web(stack: Stack) -> Iterator[Proc]:
    procs = [stack.daphne()]
    if stack.multi_process:
        procs.append(stack.worker(concurrency=2))
    yield procs[0]
    for p in procs:
        p.terminate(timeout=10)


@pytest.fixture
def client(web: Proc) -> Iterator[McpClient]:
    with McpClient(web.url) as c:
        c.initialize()
        yield c


@pytest.mark.parametrize("task_id", ["x" * 3_000_000, "a b", "../../etc", "é" * 10, ""])
def test_malformed_task_ids_are_invalid_params_before_any_io(client: McpClient, task_id: str) -> None:
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        reply = client.request(method, {"taskId": task_id})
        assert reply.message is not None and reply.message["error"]["code"] == -32602, (method, reply.body[:200])


def test_huge_task_ids_never_reach_redis(client: McpClient, stack: Stack) -> None:
    import redis

    r = redis.Redis.from_url(stack.env.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    prefix = stack.env["MCPTASKS_CHANNEL_PREFIX"]
    before = r.info("memory")["used_memory"]
    for _ in range(5):
        client.request("tasks/get", {"taskId": "A" * 1_000_000})
    keys = [k for k in r.scan_iter(match=f"{prefix}*", count=1000) if len(k) > 200]
    assert keys == []
    assert r.info("memory")["used_memory"] - before < 2_000_000


def test_deep_json_is_a_parse_error_with_400(web: Proc) -> None:
    headers = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json"}
    for body in ("[" * 100_000 + "]" * 100_000, '{"a":' * 5000 + "1" + "}" * 5000):
        r = httpx.post(web.url, content=body, headers=headers, timeout=30)
        assert r.status_code == 400, r.text[:200]
        assert r.json()["error"]["code"] == -32700


def test_nul_and_lone_surrogates_are_invalid_params(client: McpClient) -> None:
    for bad in ("nul\u0000here", "\ud800"):
        raw = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                          "params": {"name": "demo_sleep", "arguments": {"ms": 1, "note": bad}}})
        r = client.http.post(client.url, content=raw.encode(), headers=client.headers())
        assert r.status_code in (200, 400)
        assert r.json()["error"]["code"] == -32602, r.text


def test_unit_parse_rules() -> None:
    with pytest.raises(McpError) as info:
        jsonrpc.loads(b"[" * 100 + b"]" * 100)
    assert info.value.code == -32700
    with pytest.raises(McpError) as info:
        jsonrpc.parse_message({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"k\u0000": 1}})
    assert info.value.code == -32602


def test_access_token_in_url_never_reaches_the_access_log(web: Proc) -> None:
    secret = "NeverLogMe" + "Q" * 30
    r = httpx.get(f"{web.url}?access_token={secret}", headers={"Accept": "text/event-stream"})
    assert r.status_code == 400
    health_checks = web.log_text().count("/healthz")  # the start-up's health checks are logged too
    httpx.get(f"{web.base}/healthz?token={secret}")

    def logged() -> str | None:
        # Both requests are logged once the later one is (one process logs them in order).
        text = web.log_text()
        return text if text.count("/healthz") > health_checks else None

    log = wait_for("the access log line of the last request", logged, timeout=10)
    assert "GET /healthz" in log or "/mcp" in log, "the access log is expected to be on (daphne default)"
    assert secret not in log


@pytest.mark.processes(reason="starts the web and worker entry points")
def test_web_and_worker_refuse_the_development_secret_key(tmp_path: Any) -> None:
    env = {"PATH": "/usr/bin:/bin", "DEBUG": "0", "DATABASE_URL": f"sqlite:///{tmp_path / 'x.sqlite3'}",
           "MCPTASKS_VAR_DIR": str(tmp_path)}
    web = subprocess.run([sys.executable, "-c", "import mcptasks.asgi"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert web.returncode != 0 and "SECRET_KEY" in web.stderr
    worker = subprocess.run([sys.executable, "manage.py", "mcptasks_worker"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert worker.returncode != 0 and "SECRET_KEY" in worker.stderr
    ok = subprocess.run([sys.executable, "-c", "import mcptasks.asgi"], cwd=REPO,
                        env={**env, "SECRET_KEY": "k" * 50}, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr[-2000:]
