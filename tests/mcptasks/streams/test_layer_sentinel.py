"""The channel layer on a Sentinel-managed Redis: it works, and it follows a failover by itself."""

from __future__ import annotations

import asyncio
import time

from mcptasks.streams.layers import RedisChannelLayer
from tests.support.sentinel_proc import PrivateSentinel


def _layer(url: str) -> RedisChannelLayer:
    # The options settings.py gives the layer (socket timeout above the 5 s blocking read).
    hosts = [{"address": url, "socket_timeout": 10.0, "socket_connect_timeout": 2.0, "socket_keepalive": True,
              "health_check_interval": 15.0}]
    return RedisChannelLayer(hosts=hosts, prefix="t-sentinel:", pool_size=4, pool_timeout=2.0)


async def _round_trip(layer: RedisChannelLayer) -> bool:
    channel = await layer.new_channel("probe.")
    await layer.group_add("g", channel)
    await asyncio.wait_for(layer.group_send("g", {"type": "probe"}), 2)
    message = await asyncio.wait_for(layer.receive(channel), 2)
    await layer.group_discard("g", channel)
    return bool(message["type"] == "probe")


def _primary_ports(layer: RedisChannelLayer) -> set[int | None]:
    """The primary's port as every pool of the layer knows it."""
    ports: set[int | None] = set()
    for loop_layer in list(layer._layers.values()):
        for conn in list(loop_layer._connections.values()):
            address = conn.connection_pool.master_address
            ports.add(None if address is None else int(address[1]))
    return ports


def test_layer_round_trip_through_sentinel_and_after_failover(sentinel: PrivateSentinel) -> None:
    async def main() -> float:
        layer = _layer(sentinel.url)
        assert await _round_trip(layer)
        assert layer.pool_stats()["open"] >= 1
        new_port = await asyncio.to_thread(sentinel.failover)
        t0 = time.monotonic()
        while True:
            try:
                # Recovered once the pool follows the new primary: a round trip can still succeed on
                # the old one until the Sentinels demote it, and the pool's watch then drops that
                # connection under whichever command is in flight (CI saw the first "recovered" trip
                # go to the old primary and the next one fail).
                if await _round_trip(layer) and _primary_ports(layer) == {new_port}:
                    break
            except Exception:  # the window of the switch: connection killed, READONLY
                pass
            assert time.monotonic() - t0 < 10, "the layer never reached the new primary"
            await asyncio.sleep(0.1)
        recovered = time.monotonic() - t0
        # Every later round trip goes to the new primary at once.
        for _ in range(5):
            assert await _round_trip(layer)
        await layer.flush()
        return recovered

    assert asyncio.run(main()) < 10
    sentinel.wait_settled()
