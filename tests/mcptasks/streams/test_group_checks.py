"""A worker's batch of group sends skips the groups nobody is in, found in one round trip."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
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


async def test_a_member_older_than_the_group_expiry_is_not_counted() -> None:
    """As ``group_send`` would drop it; the check itself removes nothing."""
    layer = _layer()
    channel = await layer.new_channel()
    await layer.group_add("task.old", channel)
    conn = layer.connection(layer.consistent_hash("task.old"))
    key = layer._group_key("task.old")
    await conn.zadd(key, {channel: int(time.time()) - layer.group_expiry - 1})
    assert await layer.groups_with_members(["task.old", "task.none"]) == set()
    assert await conn.zcard(key) == 1


async def test_the_check_survives_a_redis_that_forgot_its_scripts() -> None:
    """A restarted Redis has no scripts loaded: the check loads it again (NOSCRIPT)."""
    layer = _layer()
    channel = await layer.new_channel()
    await layer.group_add("task.a", channel)
    assert await layer.groups_with_members(["task.a", "task.b"]) == {"task.a"}
    await layer.connection(0).script_flush()
    assert await layer.groups_with_members(["task.a", "task.b"]) == {"task.a"}


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
