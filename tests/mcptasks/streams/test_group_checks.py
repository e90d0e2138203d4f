"""A worker's batch of group sends skips the groups nobody is in, found in one round trip."""

from __future__ import annotations

import asyncio
import os
import secrets
from typing import Any

import pytest

from mcptasks.streams import layers, signals
from tests.support.requirements import require_redis


def _layer() -> layers.RedisChannelLayer:
    require_redis()
    return layers.RedisChannelLayer(hosts=[os.environ["REDIS_URL"]], prefix="chk" + secrets.token_hex(4))


async def test_groups_with_members_names_only_the_groups_someone_is_in() -> None:
    layer = _layer()
    channel = await layer.new_channel()
    await layer.group_add("task.a", channel)
    await layer.group_add("task.b", channel)
    await layer.group_discard("task.b", channel)
    assert await layer.groups_with_members(["task.a", "task.b", "task.c", "task.a"]) == {"task.a"}
    with pytest.raises(TypeError):
        await layer.groups_with_members(["bad group name!"])


def test_a_batch_sends_only_to_groups_with_members(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pushes and signals still arrive in their order where someone listens; the empty groups
    cost one pipelined check for the batch instead of two round trips each."""
    layer = _layer()
    monkeypatch.setattr(signals, "get_channel_layer", lambda: layer)
    sent: list[str] = []
    real = layer.group_send

    async def counted(group: str, message: dict[str, Any]) -> None:
        sent.append(group)
        await real(group, message)

    monkeypatch.setattr(layer, "group_send", counted)

    async def listen() -> tuple[str, list[dict[str, Any]]]:
        channel = await layer.new_channel()
        await layer.group_add("stream.s1", channel)
        await layer.group_add("task.t1", channel)
        return channel, []

    loop = asyncio.new_event_loop()
    try:
        channel, _ = loop.run_until_complete(listen())
        pushes = [("stream.s1", {"type": "stream.event", "n": 1}), ("stream.s2", {"type": "stream.event", "n": 2})]
        sigs = [("task.t1", {"type": "task.signal", "n": 3}), ("task.t2", {"type": "task.signal", "n": 4})]
        signals.send_many(pushes, sigs)
        assert sent == ["stream.s1", "task.t1"]
        got = [loop.run_until_complete(asyncio.wait_for(layer.receive(channel), 5))["n"] for _ in range(2)]
        assert got == [1, 3]
    finally:
        loop.close()
