"""Readiness under attack and under faults, on real web processes (PostgreSQL + a private Redis).

``/readyz`` decides whether an orchestrator routes traffic to a process. It must not turn 503
because clients hold SSE streams open (or opened and closed many), which would let one client
pull every busy web process out of rotation; a Redis outage (an accelerator) keeps it 200 and
says "degraded"; a database that does not answer makes it 503.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.live_support import Listener
from tests.support.client import McpClient
from tests.support.fast_subset import starts_processes
from tests.support.redis_proc import PrivateRedis
from tests.support.requirements import require_multiprocess
from tests.support.servers import Proc, Stack, free_port

pytestmark = pytest.mark.e2e

#: More than the ~15 open-then-closed streams that used to wedge the probe for good.
BURST = 20


@pytest.fixture(scope="module")
@starts_processes
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    r = PrivateRedis(Path(tmp_path_factory.mktemp("redis")))
    r.start()
    yield r
    r.thaw()
    r.stop()


@pytest.fixture(scope="module", params=["daphne", "granian", "uvicorn"])
def web(request: pytest.FixtureRequest, stack: Stack, redis: PrivateRedis) -> Iterator[Proc]:
    if not stack.multi_process:
        require_multiprocess()
    proc = stack.web(server=request.param, embedded_worker=False, extra_env={"REDIS_URL": redis.url})
    yield proc
    proc.terminate(timeout=15)


def _ready(web: Proc) -> httpx.Response:
    return httpx.get(f"{web.base}/readyz", timeout=10)


def _open_stream(web: Proc) -> Listener:
    client = McpClient(web.url, timeout=60)
    client.initialize()
    listener = Listener(client).start()
    listener.wait_primed()
    return listener


def _close(listener: Listener) -> None:
    listener.abort()
    listener.done.wait(10)


def test_readyz_stays_200_with_streams_open_and_after_bursts(web: Proc, redis: PrivateRedis) -> None:
    redis.start() if redis.proc is None or redis.proc.poll() is not None else None
    assert _ready(web).status_code == 200
    listeners = [_open_stream(web) for _ in range(5)]
    try:
        for _ in range(3):
            reply = _ready(web)
            assert reply.status_code == 200, reply.text
            assert reply.json()["channel_layer"] is True, reply.text
    finally:
        for listener in listeners:
            _close(listener)
    # One client opens and closes many streams in a row (and a few at once).
    for _ in range(BURST):
        _close(_open_stream(web))
    threads = [threading.Thread(target=lambda: _close(_open_stream(web))) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for _ in range(3):
        reply = _ready(web)
        assert reply.status_code == 200, reply.text
        assert reply.json()["channel_layer"] is True, reply.text


def test_redis_outage_is_degraded_not_unready(web: Proc, redis: PrivateRedis) -> None:
    listener = _open_stream(web)
    redis.stop()
    try:
        reply = _ready(web)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["status"] == "degraded" and body["degraded"] == ["redis"], body
        assert body["database"] is True and body["channel_layer"] is False, body
        metrics = httpx.get(f"{web.base}/metrics", timeout=10).text
        assert 'mcptasks_degraded{component="redis"} 1.0' in metrics, metrics
    finally:
        redis.start()
        _close(listener)
    # Back to ready (and no longer degraded) once Redis answers again.
    reply = _ready(web)
    assert reply.status_code == 200 and reply.json()["status"] == "ready", reply.text
    metrics = httpx.get(f"{web.base}/metrics", timeout=10).text
    assert 'mcptasks_degraded{component="redis"} 0.0' in metrics, metrics


def test_database_unreachable_is_not_ready(stack: Stack, redis: PrivateRedis) -> None:
    if not stack.multi_process:
        require_multiprocess()
    redis.start() if redis.proc is None or redis.proc.poll() is not None else None
    # Nothing listens on this port: every connection attempt is refused.
    dead = f"postgres://postgres@127.0.0.1:{free_port()}/mcptasks"
    proc = stack.web(server="daphne", embedded_worker=False, extra_env={"REDIS_URL": redis.url, "DATABASE_URL": dead})
    try:
        reply = httpx.get(f"{proc.base}/readyz", timeout=10)
        assert reply.status_code == 503, reply.text
        body = reply.json()
        assert body["status"] == "unavailable" and body["database"] is False, body
        # Redis is fine: the process is unready because of the database alone.
        assert body["channel_layer"] is True and body["degraded"] == [], body
    finally:
        proc.terminate(timeout=15)
