"""A Sentinel failover under load: a web process and a worker on REDIS_URL=redis+sentinel://….

The primary is failed over (``SENTINEL FAILOVER``) while clients poll, create tasks and read
``/readyz``: no client error, ``/readyz`` never 503 because of Redis (200, or 200 "degraded",
throughout), live notifications and worker wake-ups back on the new primary within 10 s, and
no flood of error lines in the processes' logs. Then the primary is killed and restarted (the
Sentinels make it a replica of the new one): the same again.
"""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.live_support import Listener, status_notes, twin
from tests.support.client import McpClient
from tests.support.requirements import require_multiprocess
from tests.support.sentinel_proc import PrivateSentinel
from tests.support.servers import DEFAULT_DELIVERY, Proc, Stack, web_and_worker

RECOVERY_S = 10
#: Log lines a process may write about one failover (a warning per kind of failure, a recovery
#: line or two); the bug was thousands per minute.
MAX_LOG_LINES_PER_FAILOVER = 12
#: A run starting this soon after its creation was woken up (the worker's poll is 30 s here;
#: generous for a loaded 2-core machine).
WOKEN_S = 1.0


@pytest.fixture(scope="module")
def procs(stack: Stack, sentinel: PrivateSentinel) -> Iterator[tuple[Proc, Proc]]:
    if not stack.multi_process:
        require_multiprocess()
    # The anonymous tenant gets rate limits, so every request also counts in Redis (tenants.kv).
    stack.manage("shell", "-c", "from tenants.services import get_or_create_tenant; "
                 "t = get_or_create_tenant(slug='default', name='Default'); "
                 "type(t).objects.filter(pk=t.pk).update(rate_read_per_min=100000, rate_create_per_min=100000, "
                 "rate_other_per_min=100000)")
    # A worker poll far longer than the recovery bound: a task started within it was woken up.
    env = {**DEFAULT_DELIVERY, "MCPTASKS_WORKER_POLL_S": "30", "REDIS_URL": sentinel.url}
    with web_and_worker(stack, env=env) as web:
        worker = stack.procs[-1]
        yield web, worker


def _wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _completed(listener: Listener, task_id: str) -> bool:
    return "completed" in [s for s, _ in status_notes(listener.messages, task_id)]


def _wake_up_latency(client: McpClient) -> float:
    """Seconds from creating a task to its tool starting (milliseconds with a working wake-up)."""
    t0 = time.time()
    task = client.call_task("test_stamp", {})
    result = client.request("tasks/result", {"taskId": task["taskId"]}).result
    return float(json.loads(result["content"][0]["text"])["t"] - t0)


class Load:
    """Clients polling, creating tasks and reading /readyz in threads until stopped."""

    def __init__(self, web: Proc, done_task: str) -> None:
        self.web = web
        self.done_task = done_task
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.requests = 0
        self.ready_reads = 0
        self.slowest_ready = 0.0
        #: (monotonic time, what) of each /readyz answer that was not ready.
        self.not_ready: list[tuple[float, str]] = []
        self.threads = [threading.Thread(target=self._mcp, daemon=True),
                        threading.Thread(target=self._ready, daemon=True)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _mcp(self) -> None:
        with McpClient(self.web.url, timeout=30) as c:
            c.initialize()
            n = 0
            while not self.stop.is_set():
                n += 1
                calls: list[tuple[str, dict[str, Any]]] = [("tasks/get", {"taskId": self.done_task}),
                                                           ("tasks/result", {"taskId": self.done_task})]
                for method, params in calls:
                    reply = c.request(method, params)
                    self.requests += 1
                    if reply.status != 200 or reply.message is None or "result" not in reply.message:
                        self.errors.append(f"{method}: {reply.status} {reply.body[:200]!r}")
                if n % 5 == 0:
                    try:
                        c.call_task("demo_sleep", {"ms": 0})
                        self.requests += 1
                    except Exception as exc:  # the client raises on an error reply
                        self.errors.append(f"create: {exc!r}"[:300])

    def _ready(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self.stop.is_set():
                t0 = time.monotonic()
                try:
                    r = http.get(f"{self.web.base}/readyz")
                except httpx.HTTPError as exc:  # a probe that times out is not ready either
                    self.not_ready.append((time.monotonic(), f"/readyz {exc!r}"[:300]))
                    continue
                self.slowest_ready = max(self.slowest_ready, time.monotonic() - t0)
                self.ready_reads += 1
                body = r.json()
                # "Not 503 because of Redis": a 503 only when the database is down (it is not
                # here); a Redis problem may say "degraded" with a 200.
                if r.status_code != 200 or body.get("database") is False:
                    self.not_ready.append((time.monotonic(), f"/readyz {r.status_code} {r.text[:200]}"))
                time.sleep(0.05)


def _log_lines(proc: Proc) -> list[str]:
    return proc.log_text().splitlines()


def _noisy(lines: list[str]) -> list[str]:
    """Lines that are failures, not routine output (warnings, errors, tracebacks).

    Django's one line per 503 answer of /readyz is a response log, not a failure being logged
    (there is one per probe, and none once readiness reports Redis trouble as "degraded").
    """
    words = ("WARNING", "ERROR", "CRITICAL", "Traceback", "never retrieved", "Exception")
    return [line for line in lines if any(w in line for w in words)
            and not ("django.request" in line and "/readyz" in line)]


_MOVED = re.compile(r"Redis primary of '[^']+' moved from (\S+) to (\S+);")


def _failovers_seen(lines: list[str]) -> int:
    """How many times the primary moved in ``lines`` (at least one): a killed primary that
    comes back may make the Sentinels fail over a second time, each with its own lines. Every
    Redis client of a process logs the same move, so repeats of one move count once."""
    moves = [m.groups() for m in map(_MOVED.search, lines) if m is not None]
    distinct = [move for i, move in enumerate(moves) if i == 0 or move != moves[i - 1]]
    return max(1, len(distinct))


def _check_recovered(client: McpClient, web: Proc, listener: Listener, since: float) -> None:
    # Live delivery: a task created now notifies the stream opened before the failover.
    deadline = since + RECOVERY_S
    recovered = False
    while not recovered and time.monotonic() < deadline:
        task = client.call_task("demo_sleep", {"ms": 0})["taskId"]
        recovered = _wait(lambda: _completed(listener, task), 1.0)
    assert recovered, f"no live notification within {RECOVERY_S} s of the failover"
    assert listener.error is None and not listener.done.is_set(), "the stream was dropped"
    # Wake-ups: the worker is back in its group on the new primary (milliseconds, not its poll).
    latencies: list[float] = []
    # At least three samples, even past the deadline: the median of fewer says nothing.
    while time.monotonic() < deadline or len(latencies) < 3:
        latencies.append(_wake_up_latency(client))
        if len(latencies) >= 3 and statistics.median(latencies[-3:]) < WOKEN_S:
            break
    assert statistics.median(latencies[-3:]) < WOKEN_S, latencies


@pytest.mark.parametrize("how", ["sentinel_failover", "primary_killed_and_restarted"])
def test_failover_under_load(procs: tuple[Proc, Proc], sentinel: PrivateSentinel, how: str) -> None:
    web, worker = procs
    sentinel.wait_settled()
    with McpClient(web.url, timeout=30) as client:
        client.initialize()
        done = client.call_task("demo_sleep", {"ms": 0})["taskId"]
        assert client.request("tasks/result", {"taskId": done}).status == 200
        listener = Listener(twin(client, web.url)).start()
        listener.wait_primed()
        assert statistics.median([_wake_up_latency(client) for _ in range(3)]) < WOKEN_S
        before = [len(_log_lines(p)) for p in (web, worker)]
        with Load(web, done) as load:
            time.sleep(1)
            if how == "sentinel_failover":
                sentinel.failover()
            else:
                old = sentinel.node(sentinel.primary_port())
                assert old is not None
                old.stop()
                _wait(lambda: sentinel.node(sentinel.primary_port()) is not old, 30)
                old.start()  # comes back as a replica: the Sentinels reconfigure it
            switched = time.monotonic()
            _check_recovered(client, web, listener, switched)
            time.sleep(2)
        listener.abort()
    assert load.requests > 20 and load.ready_reads > 5, (load.requests, load.ready_reads, load.not_ready,
                                                          load.slowest_ready)
    assert not load.errors, load.errors[:10]
    # /readyz: never unready because of Redis once the new primary leads (RECOVERY_S / 2 after the
    # switch); before that only while the old primary is going away (a killed primary is an outage
    # until the Sentinels promote the replica). With readiness reporting Redis trouble as a
    # 200 "degraded", not_ready stays empty.
    assert not load.not_ready, [(round(t - switched, 2), what) for t, what in load.not_ready][:10]
    for p, start in zip((web, worker), before, strict=True):
        noisy = _noisy(_log_lines(p)[start:])
        assert len(noisy) <= MAX_LOG_LINES_PER_FAILOVER * _failovers_seen(noisy), noisy[:40]
        assert not [line for line in noisy if "never retrieved" in line], noisy[:20]
