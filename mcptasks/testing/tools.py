"""Tools that make faults observable: they record every run in a database-side counter."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from django.db import connection, transaction

from mcptasks.testing.models import RunRecord
from mcptasks.tools.registry import SyncToolContext, ToolContext, ToolResult, resource, text, tool


def _record(task_key: str, attempt: int, event: str) -> None:
    with transaction.atomic():
        RunRecord._default_manager.create(task_key=task_key, attempt=attempt, event=event)
    connection.close()


async def _arecord(key: str, attempt: int, event: str) -> None:
    await asyncio.to_thread(_record, key, attempt, event)


async def _counted_run(key: str, ms: int, ctx: ToolContext) -> str:
    """Record the start, sleep ``ms``, record the end: the database sees every attempt."""
    await _arecord(key, ctx.attempt, "start")
    await asyncio.sleep(ms / 1000)
    await _arecord(key, ctx.attempt, "end")
    return f"done {key} attempt {ctx.attempt}"


@tool(task_support="optional", retryable=True, description="Records start/end in the database; sleeps ms.")
async def test_counted_retryable(key: str, ms: int = 1000, ctx: ToolContext | None = None) -> str:
    assert ctx is not None
    return await _counted_run(key, ms, ctx)


@tool(task_support="optional", retryable=False, description="Records start/end in the database; sleeps ms.")
async def test_counted_once(key: str, ms: int = 1000, ctx: ToolContext | None = None) -> str:
    assert ctx is not None
    return await _counted_run(key, ms, ctx)


@tool(task_support="optional", timeout_s=0.5, description="Sleeps past its 0.5 s timeout.")
async def test_timeout(ms: int = 5000) -> str:
    await asyncio.sleep(ms / 1000)
    return "should not happen"


@tool(task_support="optional", max_concurrency=1, description="At most one runs at a time.")
async def test_serial(key: str, ms: int = 300, ctx: ToolContext | None = None) -> str:
    assert ctx is not None
    await _arecord(key, ctx.attempt, "start")
    await asyncio.sleep(ms / 1000)
    await _arecord(key, ctx.attempt, "end")
    return "ok"


@resource("test://crash", description="Raises inside resources/read (tests -32603 without a traceback).")
async def test_crash_resource() -> str:
    raise RuntimeError("secret-crash-detail from test_crash_resource")


@tool(task_support="optional", retryable=False,
      description="A synchronous tool that never checks for cancellation: runs to completion regardless.")
def test_ignores_cancel(key: str, ms: int = 1000) -> str:
    import time

    _record(key, 1, "start")
    time.sleep(ms / 1000)
    _record(key, 1, "end")
    return f"finished {key}"


@tool(task_support="optional", retryable=False, description="Records start; on cancellation records 'stopped'.")
async def test_cancellable(key: str, ms: int = 10000, ctx: ToolContext | None = None) -> str:
    assert ctx is not None
    await _arecord(key, ctx.attempt, "start")
    try:
        await asyncio.sleep(ms / 1000)
    except asyncio.CancelledError:
        await _arecord(key, ctx.attempt, "stopped")
        raise
    await _arecord(key, ctx.attempt, "end")
    return f"done {key}"


@tool(task_support="optional", retryable=False, description="A sync tool that ignores cancellation.")
def test_stubborn(key: str, ms: int = 1500, ctx: SyncToolContext | None = None) -> str:
    assert ctx is not None
    _record(key, ctx.attempt, "start")
    time.sleep(ms / 1000)
    _record(key, ctx.attempt, "end")
    return f"late result of {key}"


@tool(task_support="optional", retryable=True, description="Returns the wall-clock time it started (latency bench).")
async def test_stamp() -> dict[str, float]:
    return {"t": time.time()}


@tool(task_support="optional", retryable=True,
      description="Sets its status message to the wall-clock time, `count` times, `gap_ms` apart (latency bench).")
async def test_status_stamps(count: int = 20, gap_ms: int = 50, ctx: ToolContext | None = None) -> str:
    assert ctx is not None
    for _ in range(max(1, min(count, 1000))):
        await ctx.set_status_message(f"{time.time():.6f}")
        await asyncio.sleep(max(0, min(gap_ms, 10_000)) / 1000)
    return "stamped"


@tool(task_support="optional", retryable=True, description="A trivial fast tool for throughput tests.")
async def test_tick(n: int = 0, ctx: ToolContext | None = None) -> str:
    assert ctx is not None
    return f"tick {n} attempt {ctx.attempt}"


@tool(task_support="optional", retryable=True,
      description="Returns a result that cannot be stored (kind: nul|object|huge).")
async def test_unstorable(kind: str = "nul") -> ToolResult | dict[str, Any]:
    if kind == "nul":
        return ToolResult(content=[text("before\x00after")])
    if kind == "object":
        return {"content": [text("ok")], "structuredContent": {"when": object()}}
    return ToolResult(content=[text("x" * (17 * 1024 * 1024))])


@tool(task_support="optional", description="Says which tenant and principal it runs for.")
async def test_whoami(ctx: ToolContext) -> str:
    return f"{ctx.tenant}/{ctx.principal}"
