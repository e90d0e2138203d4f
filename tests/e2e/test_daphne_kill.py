"""Issue 11 fault test: SIGKILL a web process under open streams; clients resume elsewhere, lose nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.live_support import status_notes, twin
from tests.support.client import McpClient, SseEvent
from tests.support.requirements import require_multiprocess
from tests.support.servers import Proc, Stack


@pytest.fixture(scope="module")
def trio(stack: Stack) -> Iterator[tuple[Proc, Proc]]:
    if not stack.multi_process:
        require_multiprocess()
    victim = stack.daphne(embedded_worker=False)
    survivor = stack.daphne(embedded_worker=False)
    worker = stack.worker(concurrency=4)
    yield victim, survivor
    for p in (victim, survivor, worker):
        p.terminate(timeout=10)


def _collect(reply_events: list[SseEvent], into: list[SseEvent]) -> str | None:
    into.extend(e for e in reply_events if e.message is not None)
    ids = [e.id for e in reply_events if e.id]
    return ids[-1] if ids else None


def test_sigkill_web_process_clients_resume_on_the_other(trio: tuple[Proc, Proc]) -> None:
    victim, survivor = trio
    with McpClient(survivor.url) as c:
        c.initialize()
        task = c.call_task("demo_progress", {"steps": 6, "interval_ms": 400}, meta={"progressToken": "k"})
        tid = task["taskId"]
        on_victim = twin(c, victim.url)
        get_events: list[SseEvent] = []
        result_events: list[SseEvent] = []
        box: dict[str, Any] = {}

        def hold_get() -> None:
            try:
                box["get"] = on_victim.listen(lambda ev: bool(get_events.append(ev)) and False)
            except Exception as exc:  # noqa: BLE001 - the connection is cut by the kill
                box["get_error"] = exc

        def hold_result() -> None:
            other = twin(c, victim.url)
            try:
                box["result"] = other.request(
                    "tasks/result", {"taskId": tid}, on_event=lambda ev: bool(result_events.append(ev)) and False
                )
            except Exception as exc:  # noqa: BLE001
                box["result_error"] = exc

        threads = [threading.Thread(target=hold_get, daemon=True), threading.Thread(target=hold_result, daemon=True)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any(e.message for e in result_events):
            time.sleep(0.05)
        assert any(e.message for e in result_events), "nothing arrived on the tasks/result stream before the kill"
        victim.kill()
        for t in threads:
            t.join(10)
        # Resume both on the surviving process from the last event id each saw.
        got_result: list[SseEvent] = []
        last = _collect(result_events, got_result)
        assert last is not None
        reply = twin(c, survivor.url).resume(last, method="tasks/result")
        _collect(reply.events, got_result)
        assert reply.message is not None and reply.result["content"] == [{"type": "text", "text": "Completed 6 steps"}]
        # The GET stream resumes on the survivor too (its replay starts after the last id seen;
        # this task's notifications went to its tasks/result stream, which is bound).
        last_get = next((e.id for e in reversed(get_events) if e.id), None)
        assert last_get is not None, "the GET stream never primed before the kill"
        resumed = twin(c, survivor.url).listen(lambda ev: ev.message is None, last_event_id=last_get)
        assert resumed.status == 200
    # Nothing lost, nothing twice, in order: the tasks/result stream carried every step.
    msgs = [e.message for e in got_result if e.message]
    progress = [m["params"]["progress"] for m in msgs if m.get("method") == "notifications/progress"]
    assert progress == [1, 2, 3, 4, 5, 6], progress
    seqs = [int(e.id.rsplit(".", 1)[1]) for e in got_result if e.id]
    assert seqs == sorted(set(seqs))
    notes = status_notes(msgs, tid)
    assert notes and notes[-1][0] == "completed"
