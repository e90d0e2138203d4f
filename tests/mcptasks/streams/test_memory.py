"""Issue 31: what the web process holds is released when its owner ends, and /metrics shows it.

The soak's heap snapshots (bench/RESULTS.md) found one queue per ended stream in channels-redis's
receive buffers: a message for a channel whose consumer was gone (a notification on its way, a
group whose discard failed) created a queue nobody ever read or removed.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from typing import Any

import pytest
from django.test import Client

from mcptasks.endpoint import consumer
from mcptasks.observability import metrics
from mcptasks.streams import layers
from tests.support.requirements import require_redis


def _layer() -> layers.RedisChannelLayer:
    require_redis()
    return layers.RedisChannelLayer(hosts=[os.environ["REDIS_URL"]], prefix="mem" + secrets.token_hex(4))


async def test_messages_for_a_channel_that_ended_without_leaving_its_group_are_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its owner never said it ended; being idle past the limit is enough.
    monkeypatch.setattr(layers, "CHANNEL_IDLE_S", 0.0, raising=False)
    layer = _layer()
    alive, ended = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("g", alive)
    await layer.group_add("g", ended)
    try:
        for i in range(20):
            await layer.group_send("g", {"type": "ping", "n": i})
            got = await asyncio.wait_for(layer.receive(alive), 5)
            assert got["n"] == i
        assert ended not in layer.receive_buffer
        assert len(layer.receive_buffer) <= 1
    finally:
        await layer.flush()


async def test_a_forgotten_channel_drops_what_is_buffered_and_what_still_arrives() -> None:
    layer = _layer()
    alive, ended = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("g", alive)
    await layer.group_add("g", ended)
    try:
        await layer.group_send("g", {"type": "ping", "n": 0})
        await asyncio.wait_for(layer.receive(alive), 5)
        assert layer.receive_buffer[ended].qsize() == 1  # live: kept for its owner
        layers.forget_channel(layer, ended)
        assert ended not in layer.receive_buffer
        for i in range(1, 10):
            await layer.group_send("g", {"type": "ping", "n": i})
            await asyncio.wait_for(layer.receive(alive), 5)
        assert ended not in layer.receive_buffer and ended not in layer.live_channels
        assert layer.buffer_stats()["buffers"] <= 1
    finally:
        await layer.flush()


@pytest.mark.django_db
def test_metrics_show_the_process_memory_and_its_live_objects(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": "m-" + secrets.token_hex(8)}
    loop = asyncio.new_event_loop()
    try:
        metrics.note_loop(loop)
        loop.run_until_complete(asyncio.sleep(0))
        resp = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.MCPTASKS['METRICS_TOKEN']}")
    finally:
        loop.close()
    assert resp.status_code == 200
    text = resp.content.decode()
    rss = next(line for line in text.splitlines() if line.startswith("process_resident_memory_bytes "))
    assert float(rss.split()[1]) > 10_000_000
    assert consumer.metrics is metrics  # the consumer module registers its streams count
    assert 'mcptasks_process_objects{kind="streams"}' in text
    assert 'mcptasks_process_objects{kind="asyncio_tasks"}' in text
