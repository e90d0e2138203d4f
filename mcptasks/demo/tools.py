"""Demo tools (one per behaviour a client wants to try: sleep, fail, crash, progress, ask, sample),
plus a demo resource, resource template and prompt, so every list a client opens has something in it."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated

from pydantic import Field

from mcptasks.tools.registry import (
    SyncToolContext,
    ToolContext,
    ToolResult,
    prompt,
    registry,
    resource,
    resource_template,
    text,
    tool,
)

# Bounds of the demo tools' arguments: whoever may call tools may call these, so none of them
# may hold a worker slot for long, loop without end or carry an unbounded string.
#: Longest demo sleep (ms): ten minutes.
MAX_SLEEP_MS = 600_000
#: Most progress steps and longest interval between them (ms).
MAX_STEPS = 100
MAX_INTERVAL_MS = 10_000
#: Longest message, question or prompt (characters).
MAX_TEXT = 1000

SleepMs = Annotated[int, Field(ge=0, le=MAX_SLEEP_MS)]
Text = Annotated[str, Field(max_length=MAX_TEXT)]


@tool(
    title="Sleep",
    task_support="optional",
    retryable=True,
    annotations={"readOnlyHint": True, "idempotentHint": True},
    immediate_response="The sleep has started; its result will be available from the task.",
)
async def demo_sleep(ms: SleepMs = 1000, ctx: ToolContext | None = None) -> str:
    """Sleep for `ms` milliseconds, then say so. Cancellable at any moment."""
    await asyncio.sleep(ms / 1000)
    return f"Slept for {ms} ms"


@tool(title="Fail", task_support="optional", annotations={"readOnlyHint": True})
async def demo_fail(message: Text = "demo failure") -> ToolResult:
    """Return a tool result with isError: true carrying `message`."""
    return ToolResult(content=[text(message)], is_error=True)


@tool(title="Crash", task_support="optional")
async def demo_crash(message: Text = "demo crash") -> str:
    """Raise an exception with `message` (the task fails with a diagnostic)."""
    raise RuntimeError(message)


@tool(title="Progress", task_support="optional", annotations={"readOnlyHint": True})
async def demo_progress(
    steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] = 5,
    interval_ms: Annotated[int, Field(ge=0, le=MAX_INTERVAL_MS)] = 200,
    ctx: ToolContext | None = None,
) -> str:
    """Report progress `steps` times, `interval_ms` apart, and update the task's status message."""
    assert ctx is not None
    for i in range(1, steps + 1):
        await asyncio.sleep(interval_ms / 1000)
        await ctx.report_progress(i, steps, f"step {i} of {steps}")
        await ctx.set_status_message(f"step {i} of {steps}")
    return f"Completed {steps} steps"


@tool(title="Ask", task_support="required")
async def demo_ask(question: Text, ctx: ToolContext) -> str:
    """Ask the user `question` through elicitation and return the answer."""
    answer = await ctx.elicit(
        question,
        {"type": "object", "properties": {"answer": {"type": "string", "description": question}},
         "required": ["answer"]},
    )
    if answer.get("action") != "accept":
        return f"The user chose to {answer.get('action', 'cancel')}"
    return str((answer.get("content") or {}).get("answer", ""))


@tool(title="Sample", task_support="required")
async def demo_sample(prompt: Text, ctx: ToolContext) -> str:
    """Ask the client's model to answer `prompt` and return its text."""
    result = await ctx.sample(prompt, max_tokens=200)
    content = result.get("content") or {}
    if isinstance(content, list):
        content = content[0] if content else {}
    return str(content.get("text", ""))


@tool(title="Quick", task_support="forbidden", annotations={"readOnlyHint": True})
async def demo_quick() -> str:
    """Return at once (never runs as a task)."""
    return "quick"


@tool(title="Sync sleep", task_support="optional", retryable=False)
def demo_sync_sleep(ms: SleepMs = 1000, ctx: SyncToolContext | None = None) -> str:
    """A synchronous tool: sleeps in small steps, checking for cancellation."""
    assert ctx is not None
    deadline = time.monotonic() + ms / 1000
    while time.monotonic() < deadline:
        ctx.check_cancelled()
        time.sleep(0.02)
    return f"Slept for {ms} ms (sync)"


# --- resources and prompts -----------------------------------------------------------------------


@resource("demo://tools", name="demo-tools", title="Demo tools",
          description="The demo tools and how each may be called (JSON).", mime_type="application/json")
def demo_tools() -> str:
    """Every demo tool with its description and task support, read from the registry."""
    listed = [
        {"name": t.name, "description": t.description, "taskSupport": t.task_support}
        for t in registry.sorted_tools()
        if t.name.startswith("demo_")
    ]
    return json.dumps(listed, indent=2)


@resource_template("demo://echo/{message}", name="demo-echo", title="Echo",
                   description="Reads back the `message` in the URI.", mime_type="text/plain")
def demo_echo(message: str) -> str:
    """The template variable, as text."""
    return message


@prompt(
    "demo_task_walkthrough",
    title="Try a durable task",
    description="Asks the model to run demo_sleep as a task and report its outcome.",
    arguments=[{"name": "ms", "description": "How long the tool sleeps, in milliseconds", "required": False}],
)
def demo_task_walkthrough(ms: str = "2000") -> list[dict[str, object]]:
    """One user message that walks through create, poll and result."""
    return [{"role": "user", "content": text(
        f"Call the tool demo_sleep with ms={ms} as a task (pass a `task` parameter), poll tasks/get "
        "until it is completed, then fetch the result with tasks/result and tell me what it said."
    )}]
