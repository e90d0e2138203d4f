"""Helpers for the live-update tests: a pair of servers, background stream listeners, polling."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.client import McpClient, SseEvent, cut
from tests.support.servers import Proc, Stack

RELATED = "io.modelcontextprotocol/related-task"


@dataclass
class Pair:
    """Two entry points to one deployment: two daphnes (+ two workers) on PG+Redis, else one."""

    a: Proc
    b: Proc
    multi: bool


@contextmanager
def start_pair(
    stack: Stack, *, extra_env: dict[str, str] | None = None, server: str = "daphne"
) -> Iterator[Pair]:
    """Two web processes (under ``server``) and two workers when processes can share state, else one."""
    procs: list[Proc] = []
    try:
        if stack.multi_process:
            a = stack.web(server=server, embedded_worker=False, extra_env=extra_env)
            procs.append(a)
            b = stack.web(server=server, embedded_worker=False, extra_env=extra_env)
            procs.append(b)
            procs.append(stack.worker(concurrency=4, extra_env=extra_env))
            procs.append(stack.worker(concurrency=4, extra_env=extra_env))
            yield Pair(a, b, True)
        else:
            a = stack.web(server=server, extra_env=extra_env)
            procs.append(a)
            yield Pair(a, a, False)
    finally:
        for p in procs:  # signal all first: they shut down in parallel
            if p.alive:
                p.popen.send_signal(signal.SIGTERM)
        for p in procs:
            p.terminate(timeout=10)


def twin(client: McpClient, url: str) -> McpClient:
    """Another client on the same session (sessions live in the database), possibly via another process."""
    other = McpClient(url, token=client.token, protocol_version=client.protocol_version,
                      capabilities=client.capabilities)
    other.session_id = client.session_id
    return other


@dataclass
class Listener:
    """Reads one GET stream in a background thread, recording every event."""

    client: McpClient
    last_event_id: str | None = None
    until: Callable[[SseEvent], bool] = lambda _ev: False
    events: list[SseEvent] = field(default_factory=list)
    primed: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    status: int | None = None
    error: BaseException | None = None
    stop_flag: bool = False
    response: httpx.Response | None = None

    def start(self) -> Listener:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _on_event(self, ev: SseEvent) -> bool:
        self.events.append(ev)
        self.primed.set()
        return self.stop_flag or self.until(ev)

    def _run(self) -> None:
        try:
            reply = self.client.listen(self._on_event, last_event_id=self.last_event_id, on_open=self._opened)
            self.status = reply.status
        except (httpx.HTTPError, RuntimeError) as exc:
            self.error = exc
        finally:
            self.primed.set()
            self.done.set()

    def _opened(self, resp: httpx.Response) -> None:
        self.response = resp

    def wait_primed(self, timeout: float = 15) -> None:
        assert self.primed.wait(timeout), "the GET stream never sent its priming event"
        assert self.error is None, self.error

    def wait_done(self, timeout: float = 30) -> None:
        assert self.done.wait(timeout), f"the stream did not end within {timeout}s; got {self.messages}"

    def abort(self) -> None:
        self.stop_flag = True
        if self.response is not None:
            cut(self.response)
        self.client.http.close()

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [e.message for e in self.events if e.message is not None]

    @property
    def last_id(self) -> str | None:
        ids = [e.id for e in self.events if e.id]
        return ids[-1] if ids else None


def status_notes(messages: list[dict[str, Any]], task_id: str) -> list[tuple[str, str | None]]:
    """(status, statusMessage) of every notifications/tasks/status about ``task_id``, in order."""
    return [
        (m["params"]["status"], m["params"].get("statusMessage"))
        for m in messages
        if m.get("method") == "notifications/tasks/status" and m["params"]["taskId"] == task_id
    ]


def is_terminal_note(task_id: str) -> Callable[[SseEvent], bool]:
    """Stop predicate: a terminal status notification of ``task_id``."""
    def check(ev: SseEvent) -> bool:
        m = ev.message
        return bool(
            m and m.get("method") == "notifications/tasks/status" and m["params"]["taskId"] == task_id
            and m["params"]["status"] in ("completed", "failed", "cancelled")
        )
    return check


def wait_status(client: McpClient, task_id: str, wanted: set[str], timeout: float = 20) -> dict[str, Any]:
    """Poll tasks/get (at the server's pollInterval, bounded) until the status is in ``wanted``."""
    deadline = time.monotonic() + timeout
    task: dict[str, Any] = {}
    while time.monotonic() < deadline:
        task = client.request("tasks/get", {"taskId": task_id}).result
        if task["status"] in wanted:
            return task
        time.sleep(min(task.get("pollInterval", 200), 200) / 1000)
    raise AssertionError(f"task {task_id} never reached {wanted}; last {task}")
