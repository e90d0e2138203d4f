"""Issue 25 item 6: a tool's progress cannot flood the database or a client's stream.

Progress is coalesced to at most ``MCPTASKS_PROGRESS_MAX_PER_S`` notifications per second per
run (as many in a burst), the latest one kept (and sent before the outcome); every stream keeps at most
``MCPTASKS_STREAM_MAX_EVENTS`` stored events, the newest.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from mcptasks.models import StreamEvent, Task, TaskStatus
from mcptasks.streams import events
from mcptasks.tools.registry import Registry, ToolContext
from mcptasks.worker.loop import Worker
from tests.support.factories import task_row

FLOOD = 1000

reg = Registry()


@reg.tool(task_support="optional")
async def sec_progress_flood(ctx: ToolContext) -> str:
    """Reports progress as fast as it can."""
    for i in range(1, FLOOD + 1):
        await ctx.report_progress(i, FLOOD, f"step {i}")
    return "flooded"


def _progress_rows(session_id: str) -> list[dict[str, Any]]:
    rows = StreamEvent.objects.filter(session_id=session_id).order_by("stream_id", "seq").values_list("data", flat=True)
    return [m for m in (json.loads(d) for d in rows) if m.get("method") == "notifications/progress"]


@pytest.mark.django_db(transaction=True)
async def test_progress_is_coalesced_to_the_rate_and_the_latest_is_kept(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "PROGRESS_MAX_PER_S": 5.0}
    row = await sync_to_async(task_row)("sec_progress_flood", progress_token="tok")
    await sync_to_async(Task.objects.filter(pk=row.pk).update)(session_id="sec-flood")
    row.session_id = "sec-flood"
    await sync_to_async(events.open_get_stream)(session_id="sec-flood")  # the client listens
    worker = Worker(concurrency=1, worker_id="sec-flood", registry_=reg, run_cleanup=False)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        worker._start(row)
        (atask, _backend, _attempt) = worker.running[row.task_id]
        await asyncio.wait_for(atask, 60)
    finally:
        worker.tool_executor.shutdown(wait=True)
        worker._lease.shutdown()
        worker._housekeeping.shutdown()
        await sync_to_async(lambda: connection.close())()
    elapsed = loop.time() - started
    await sync_to_async(row.refresh_from_db)()
    assert row.status == TaskStatus.COMPLETED
    sent = await sync_to_async(_progress_rows)("sec-flood")
    # At most 5 a second after a burst of 5 (plus the latest at the end), not 1000.
    assert 1 <= len(sent) <= 5 + 5 * elapsed + 1, (len(sent), elapsed)
    progress = [m["params"]["progress"] for m in sent]
    assert progress == sorted(progress) and progress[-1] == FLOOD  # the latest one is never lost


@pytest.mark.django_db
def test_a_stream_keeps_at_most_the_newest_events(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "STREAM_MAX_EVENTS": 20}
    ids = [events.publish(session_id="sec-cap", stream_id="sec-cap-stream", message={"n": i}) for i in range(60)]
    rows = list(StreamEvent.objects.filter(stream_id="sec-cap-stream").order_by("seq").values_list("seq", "data"))
    assert len(rows) == 20
    assert [s for s, _ in rows] == list(range(41, 61))  # the newest, numbering unbroken
    assert json.loads(rows[-1][1]) == {"n": 59}
    assert len(set(ids)) == 60
    # Other streams are untouched.
    events.publish(session_id="sec-cap", stream_id="sec-other", message={"n": 0})
    assert StreamEvent.objects.filter(stream_id="sec-other").count() == 1
