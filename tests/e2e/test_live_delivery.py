"""Live delivery on the default settings over PostgreSQL + Redis: quiet streams, load, pools.

Every stream here is quiet for far longer than the channel layer's 5 s blocking read (redis-py
8 once timed that read out at 5 s and left every such stream deaf), and the process under load
must keep its Redis connections within its configured pools.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from tests.e2e.live_support import Listener, is_terminal_note, status_notes, twin
from tests.support.client import McpClient
from tests.support.redis_proc import tcp_connections_to_port
from tests.support.requirements import require_multiprocess
from tests.support.servers import DEFAULT_DELIVERY, Proc, Stack, web_and_worker

#: The pools a web process may hold: the layer's (one event loop) and the counters client.
POOL_LIMIT = 50 + 20


@pytest.fixture(scope="module")
def web(stack: Stack) -> Iterator[Proc]:
    if not stack.multi_process:
        require_multiprocess()
    with web_and_worker(stack, env=DEFAULT_DELIVERY) as proc:
        yield proc


@pytest.fixture
def client(web: Proc) -> Iterator[McpClient]:
    with McpClient(web.url, timeout=60) as c:
        c.initialize()
        yield c


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_quiet_streams_deliver_everything(client: McpClient, web: Proc) -> None:
    """A 30 s plain call, a blocking tasks/result silent for 30 s, a GET stream fed every 20 s."""
    # Keep-alives keep a deaf stream open forever: every wait below has its own deadline, and
    # the clients are closed at the end, so a regression fails instead of hanging.
    plain_client, result_client = McpClient(web.url, timeout=60), McpClient(web.url, timeout=60)
    plain_client.initialize()
    result_client.initialize()
    slow = result_client.call_task("demo_sleep", {"ms": 30_000})
    listener = Listener(twin(client, web.url)).start()
    listener.wait_primed()
    try:
        plain, plain_out = _in_thread(lambda: plain_client.call("demo_sleep", {"ms": 30_000}).result)
        blocking, blocking_out = _in_thread(
            lambda: result_client.request("tasks/result", {"taskId": slow["taskId"]}).result
        )
        task_ids = []
        for i in range(3):
            if i:
                time.sleep(20)
            task_ids.append(client.call_task("demo_sleep", {"ms": 0})["taskId"])
        listener.until = is_terminal_note(task_ids[-1])
        plain.join(15)
        blocking.join(15)
        listener.done.wait(15)
    finally:
        for c in (plain_client, result_client):
            c.close()
        listener.abort()
    assert plain_out and not isinstance(plain_out[0], BaseException), f"plain tools/call: {plain_out}"
    assert plain_out[0]["content"][0]["text"] == "Slept for 30000 ms"
    assert blocking_out and not isinstance(blocking_out[0], BaseException), f"tasks/result: {blocking_out}"
    assert blocking_out[0]["content"][0]["text"] == "Slept for 30000 ms"
    for tid in task_ids:
        assert "completed" in [s for s, _ in status_notes(listener.messages, tid)], (tid, listener.messages)


def _set_read_limit(stack: Stack, per_min: int | None) -> None:
    stack.manage(
        "shell", "-c",
        f"from tenants.models import Tenant; Tenant.objects.filter(slug='default').update(rate_read_per_min={per_min})",
    )


def test_many_polls_keep_redis_connections_within_the_pools(client: McpClient, web: Proc, stack: Stack) -> None:
    # A read limit makes every tasks/get go to Redis (poll notes and counters).
    _set_read_limit(stack, 1_000_000)
    try:
        time.sleep(2.5)  # the tenant's limits are cached for up to 2 s
        task_id = client.call_task("demo_sleep", {"ms": 0})["taskId"]
        redis_port = urlparse(stack.env["REDIS_URL"]).port or 6379
        before = tcp_connections_to_port(web.popen.pid, redis_port)

        def poll(n: int) -> int:
            ok = 0
            with McpClient(web.url) as c:
                c.session_id, c.protocol_version = client.session_id, client.protocol_version
                for _ in range(n):
                    reply = c.request("tasks/get", {"taskId": task_id})
                    ok += reply.status == 200 and reply.result["taskId"] == task_id
            return ok

        with ThreadPoolExecutor(8) as pool:
            answered = sum(pool.map(poll, [625] * 8))
        after = tcp_connections_to_port(web.popen.pid, redis_port)
    finally:
        _set_read_limit(stack, None)
    assert answered == 5000
    assert after <= POOL_LIMIT, f"{after} Redis connections after 5,000 tasks/get (before: {before})"


def test_five_hundred_get_streams_at_once(web: Proc) -> None:
    sessions: list[str] = []
    lock = threading.Lock()

    def open_session(_: int) -> None:
        with McpClient(web.url) as c:
            c.initialize()
            with lock:
                sessions.append(c.session_id or "")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(open_session, range(500)))
    assert len(sessions) == 500

    async def open_all() -> list[int]:
        limits = httpx.Limits(max_connections=600, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:

            async def one(sid: str) -> int:
                headers = {"Accept": "text/event-stream", "Mcp-Session-Id": sid,
                           "MCP-Protocol-Version": "2025-11-25"}
                async with http.stream("GET", web.url, headers=headers) as resp:
                    if resp.status_code == 200:
                        # Read the priming event: the stream really is open.
                        async for line in resp.aiter_lines():
                            if line.startswith("id:"):
                                break
                    return resp.status_code

            return list(await asyncio.gather(*(one(s) for s in sessions)))

    statuses = asyncio.run(open_all())
    assert statuses.count(200) == 500, {s: statuses.count(s) for s in set(statuses)}
    # The process still answers afterwards.
    with McpClient(web.url) as c:
        c.initialize()
        assert c.request("ping").result == {}
