"""Elicitation across processes: the POST stream is held by daphne A, the answer reaches daphne B."""

from __future__ import annotations

import json
from typing import Any

from tests.support.client import McpClient
from tests.support.requirements import require_multiprocess
from tests.support.servers import Stack


def test_answer_posted_to_another_daphne_reaches_the_tool(stack: Stack) -> None:
    require_multiprocess()
    a = stack.daphne(embedded_worker=False)
    b = stack.daphne(embedded_worker=False)
    worker = stack.worker(concurrency=2)
    try:
        seen: list[dict[str, Any]] = []

        def answer(req: dict[str, Any]) -> dict[str, Any]:
            seen.append(req)
            return {"action": "accept", "content": {"username": "cross", "email": "cross@example.com"}}

        with McpClient(a.url) as client:
            client.initialize()
            reply = client.request(
                "tools/call",
                {"name": "test_elicitation", "arguments": {"message": "Across processes?"}},
                on_request=answer,
                answer_url=b.url,  # McpClient asserts B answered 202
            )
        assert [r["method"] for r in seen] == ["elicitation/create"]
        assert reply.status == 200 and reply.content_type.startswith("text/event-stream")
        prefix = "User response: action=accept, content="
        text = reply.result["content"][0]["text"]
        assert text.startswith(prefix)
        assert json.loads(text[len(prefix):]) == {"username": "cross", "email": "cross@example.com"}
    finally:
        for proc in (worker, b, a):
            proc.terminate(timeout=10)
