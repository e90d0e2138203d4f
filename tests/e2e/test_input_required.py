"""input_required: elicitation and sampling inside tasks, answered from any process.

The tool's request is stored with the related-task ``_meta``; the task shows
``input_required`` on tasks/get; the request itself is delivered only on the ``tasks/result``
stream; the client's response may be POSTed to any server process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.live_support import RELATED, Pair, status_notes, twin, wait_status
from tests.support.client import McpClient, SseEvent
from tests.support.requirements import require_multiprocess

CAPABILITY_MISSING = -32012


@pytest.fixture
def client(pair: Pair) -> Iterator[McpClient]:
    with McpClient(pair.a.url) as c:
        c.initialize()
        yield c


def _first_request(client: McpClient, task_id: str) -> dict[str, Any]:
    """Open tasks/result, take the first server->client request, drop the connection."""
    got: list[dict[str, Any]] = []

    def stop(ev: SseEvent) -> bool:
        m = ev.message
        if m is not None and "method" in m and "id" in m:
            got.append(m)
            return True
        return False

    client.request("tasks/result", {"taskId": task_id}, on_event=stop)
    assert got, "no request arrived on the tasks/result stream"
    return got[0]


def test_elicitation_answered_through_other_process(client: McpClient, pair: Pair) -> None:
    if not pair.multi:
        require_multiprocess()
    _elicitation_roundtrip(client, pair.b.url)


def test_elicitation_roundtrip_single_process(client: McpClient, pair: Pair) -> None:
    _elicitation_roundtrip(client, pair.a.url)


def _elicitation_roundtrip(client: McpClient, answer_url: str) -> None:
    task = client.call_task("demo_ask", {"question": "Your name?"})
    tid = task["taskId"]
    waiting = wait_status(client, tid, {"input_required"})
    assert "elicitation" not in str(waiting)  # tasks/get shows the state, never the request
    asked: list[dict[str, Any]] = []

    def answer(req: dict[str, Any]) -> dict[str, Any]:
        asked.append(req)
        return {"action": "accept", "content": {"answer": "Ada"}}

    reply = client.request("tasks/result", {"taskId": tid}, on_request=answer, answer_url=answer_url)
    assert reply.result["content"] == [{"type": "text", "text": "Ada"}]
    assert reply.result["_meta"][RELATED] == {"taskId": tid}
    assert len(asked) == 1
    req = asked[0]
    assert req["method"] == "elicitation/create" and req["params"]["message"] == "Your name?"
    assert req["params"]["_meta"][RELATED] == {"taskId": tid}
    # Back to working after the answer, then completed: notified on this tasks/result stream.
    notes = [s for s, _m in status_notes(reply.notifications, tid)]
    assert notes[-2:] == ["working", "completed"], notes
    assert client.request("tasks/get", {"taskId": tid}).result["status"] == "completed"


def test_sampling_answered(client: McpClient, pair: Pair) -> None:
    task = client.call_task("demo_sample", {"prompt": "Say hi"})

    def answer(req: dict[str, Any]) -> dict[str, Any]:
        assert req["method"] == "sampling/createMessage"
        assert req["params"]["_meta"][RELATED] == {"taskId": task["taskId"]}
        return {"role": "assistant", "content": {"type": "text", "text": "hi!"}, "model": "test-model"}

    reply = client.request("tasks/result", {"taskId": task["taskId"]}, on_request=answer, answer_url=pair.b.url)
    assert reply.result["content"] == [{"type": "text", "text": "hi!"}]


def test_missing_capability_fails_the_task_with_a_diagnostic(pair: Pair) -> None:
    with McpClient(pair.a.url, capabilities={}) as c:
        c.initialize()
        task = c.call_task("demo_ask", {"question": "Anyone?"})
        reply = c.request("tasks/result", {"taskId": task["taskId"]})
        assert reply.error["code"] == CAPABILITY_MISSING
        assert "elicitation" in reply.error["message"]
        assert reply.requests == []  # nothing was ever asked
        final = c.request("tasks/get", {"taskId": task["taskId"]}).result
        assert final["status"] == "failed"
        assert "elicitation capability" in final["statusMessage"]


def test_dropped_tasks_result_redelivers_pending_request(client: McpClient, pair: Pair) -> None:
    task = client.call_task("demo_ask", {"question": "Again?"})
    first = _first_request(client, task["taskId"])  # delivered, then the connection dropped
    assert client.request("tasks/get", {"taskId": task["taskId"]}).result["status"] == "input_required"
    seen: list[str] = []

    def answer(req: dict[str, Any]) -> dict[str, Any]:
        seen.append(req["id"])
        return {"action": "accept", "content": {"answer": "yes"}}

    reply = twin(client, pair.b.url).request("tasks/result", {"taskId": task["taskId"]}, on_request=answer)
    assert seen == [first["id"]]  # the same pending request, once
    assert reply.result["content"] == [{"type": "text", "text": "yes"}]


def test_declined_elicitation_reaches_the_tool(client: McpClient) -> None:
    task = client.call_task("demo_ask", {"question": "Share?"})
    reply = client.request("tasks/result", {"taskId": task["taskId"]}, on_request=lambda r: {"action": "decline"})
    assert reply.result["content"] == [{"type": "text", "text": "The user chose to decline"}]


def test_cancel_drops_the_queue(client: McpClient, pair: Pair) -> None:
    task = client.call_task("demo_ask", {"question": "Wait?"})
    req = _first_request(client, task["taskId"])
    cancelled = client.request("tasks/cancel", {"taskId": task["taskId"]}).result
    assert cancelled["status"] == "cancelled"
    # The pending request died with the task: a late answer (to any process) is refused.
    late = client.respond(req["id"], {"action": "accept", "content": {"answer": "late"}}, url=pair.b.url)
    assert late.status_code == 400
    reply = client.request("tasks/result", {"taskId": task["taskId"]})
    assert reply.error["message"] == "Task was cancelled"
    assert client.request("tasks/get", {"taskId": task["taskId"]}).result["status"] == "cancelled"


def test_unanswered_request_is_bounded_by_ttl(client: McpClient) -> None:
    task = client.call_task("demo_ask", {"question": "Silence?"}, ttl=2000)
    # Keep tasks/result open without answering: the worker gives up when the ttl runs out
    # and the stream ends with the task's failure instead of waiting forever.
    reply = client.request("tasks/result", {"taskId": task["taskId"]}, on_request=lambda r: None)
    assert len(reply.requests) == 1
    # Either the worker's own give-up (the task failed: "No response ... before the task's ttl
    # ran out") or, if the stream noticed the expiry first, the spec's expired-task error.
    assert "ttl ran out" in reply.error["message"] or "expired" in reply.error["message"].lower(), reply.error
