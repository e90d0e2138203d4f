"""The harness itself: a server starts, a tool runs, a task completes."""

from tests.support.client import McpClient


def test_plain_call_and_task_roundtrip(client: McpClient) -> None:
    reply = client.call("test_simple_text")
    assert reply.result["content"] == [{"type": "text", "text": "This is a simple text response for testing."}]
    task = client.call_task("demo_sleep", {"ms": 50})
    assert task["status"] == "working"
    result = client.request("tasks/result", {"taskId": task["taskId"]})
    assert result.result["content"][0]["text"] == "Slept for 50 ms"
    assert result.result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
