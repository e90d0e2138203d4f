"""Redis faults under load, on a private Redis that the test stops, restarts and freezes.

Redis is an accelerator: with it gone, reads, terminal results, creation and cancellation are
served from PostgreSQL; open streams fall back to reading the store and rejoin their groups when
Redis returns (empty, as after a restart); the worker rejoins its wake-up group.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.live_support import Listener, status_notes, twin
from tests.support.client import McpClient
from tests.support.redis_proc import PrivateRedis
from tests.support.requirements import require_multiprocess
from tests.support.servers import DEFAULT_DELIVERY, Proc, Stack, web_and_worker

OUTAGE_S = 30
FREEZE_S = 10


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    r = PrivateRedis(Path(tmp_path_factory.mktemp("redis")))
    r.start()
    yield r
    r.thaw()
    r.stop()


@pytest.fixture(scope="module")
def web(stack: Stack, redis: PrivateRedis) -> Iterator[Proc]:
    if not stack.multi_process:
        require_multiprocess()
    with web_and_worker(stack, env={**DEFAULT_DELIVERY, "REDIS_URL": redis.url}) as proc:
        yield proc


@pytest.fixture
def client(web: Proc) -> Iterator[McpClient]:
    with McpClient(web.url, timeout=30) as c:
        c.initialize()
        yield c


def _completed(listener: Listener, task_id: str) -> bool:
    return "completed" in [s for s, _ in status_notes(listener.messages, task_id)]


def _wake_up_latency(client: McpClient) -> float:
    """Seconds from creating a task to its tool starting in the worker (same machine clock).

    With the wake-up group working this is milliseconds; a worker that missed the wake-up only
    claims at its poll backstop (MCPTASKS_WORKER_POLL_S, 2 s here).
    """
    import json
    import time as _time

    t0 = _time.time()
    task = client.call_task("test_stamp", {})
    result = client.request("tasks/result", {"taskId": task["taskId"]}).result
    started = json.loads(result["content"][0]["text"])["t"]
    return float(started - t0)


def _wait(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_redis_outage_reads_from_the_database_and_recovers(client: McpClient, web: Proc, redis: PrivateRedis) -> None:
    done = client.call_task("demo_sleep", {"ms": 0})["taskId"]
    assert client.request("tasks/result", {"taskId": done}).status == 200
    listener = Listener(twin(client, web.url)).start()
    listener.wait_primed()

    redis.stop()
    ok = total = 0
    created: list[str] = []
    errors: list[str] = []
    deadline = time.monotonic() + OUTAGE_S
    while time.monotonic() < deadline:
        for method, params in (("tasks/get", {"taskId": done}), ("tasks/result", {"taskId": done})):
            total += 1
            reply = client.request(method, params)
            if reply.status == 200 and reply.message is not None and "result" in reply.message:
                ok += 1
            else:
                errors.append(f"{method}: {reply.status} {reply.body[:200]!r}")
        if len(created) < OUTAGE_S // 3 and time.monotonic() > deadline - OUTAGE_S + 3 * len(created):
            total += 2
            long = client.call_task("demo_sleep", {"ms": 60_000})["taskId"]
            cancelled = client.request("tasks/cancel", {"taskId": long})
            ok += 1 + (cancelled.status == 200 and cancelled.result["status"] == "cancelled")
            created.append(client.call_task("demo_sleep", {"ms": 0})["taskId"])
            total += 1
            ok += 1
    assert ok / total >= 0.99, (ok, total, errors[:5])
    # Tasks created during the outage ran (claimed by the poll backstop) and their notifications
    # reached the stream opened before the outage, through the store.
    assert _wait(lambda: all(_completed(listener, t) for t in created), 10), listener.messages

    redis.start()  # empty: every group membership is gone
    back = time.monotonic()
    after = client.call_task("demo_sleep", {"ms": 0})["taskId"]
    assert _wait(lambda: _completed(listener, after), 5), "no notification within 5 s of Redis returning"
    assert listener.error is None and not listener.done.is_set(), "the stream was dropped"
    # The worker is back in its wake-up group: a new task starts within 100 ms.
    time.sleep(max(0.0, back + 3 - time.monotonic()))
    latencies = [_wake_up_latency(client) for _ in range(5)]
    assert statistics.median(latencies) < 0.1, latencies
    listener.abort()


def test_frozen_redis_does_not_stall_requests_that_need_no_redis(
    client: McpClient, web: Proc, redis: PrivateRedis
) -> None:
    done = client.call_task("demo_sleep", {"ms": 0})["taskId"]
    assert client.request("tasks/result", {"taskId": done}).status == 200
    listener = Listener(twin(client, web.url)).start()
    listener.wait_primed()
    redis.freeze()
    slowest = 0.0
    answered = 0
    try:
        deadline = time.monotonic() + FREEZE_S
        while time.monotonic() < deadline:
            for method, params in (("ping", None), ("tasks/get", {"taskId": done}), ("tools/list", {})):
                t0 = time.monotonic()
                reply = client.request(method, params)
                slowest = max(slowest, time.monotonic() - t0)
                assert reply.status == 200 and "result" in (reply.message or {}), reply.body
                answered += 1
    finally:
        redis.thaw()
    assert answered > 30
    assert slowest < 1.0, f"a request that needs no Redis took {slowest:.2f} s while Redis was frozen"
    # And the stream opened before the freeze still delivers afterwards.
    after = client.call_task("demo_sleep", {"ms": 0})["taskId"]
    assert _wait(lambda: _completed(listener, after), 15), listener.messages
    listener.abort()
