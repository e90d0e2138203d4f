"""Prometheus metrics of this process (``GET /metrics``).

Collected at scrape time from the live objects, so a metric never drifts from what it
describes: the Redis connection pools of the channel layer and of the counters client.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from channels.layers import get_channel_layer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tenants import kv

#: What ``/metrics`` serves (a registry of our own: no default process collectors twice).
REGISTRY = CollectorRegistry(auto_describe=True)


class RedisPoolCollector(Collector):
    """Open, in-use and maximum connections of each Redis pool of the process."""

    def collect(self) -> Iterator[Any]:
        """One gauge family per measure, labelled by pool."""
        pools: dict[str, dict[str, int]] = {"counters": kv.pool_stats()}
        layer = get_channel_layer()
        stats = getattr(layer, "pool_stats", None)
        if callable(stats):
            pools["channel_layer"] = stats()
        for measure, help_text in (
            ("open", "Redis connections the pool has open"),
            ("in_use", "Redis connections currently checked out of the pool"),
            ("max", "Most connections the pool may open (per event loop for the channel layer)"),
        ):
            family = GaugeMetricFamily(f"mcptasks_redis_pool_{measure}_connections", help_text, labels=["pool"])
            for name, values in pools.items():
                family.add_metric([name], values[measure])
            yield family
        breaker = GaugeMetricFamily(
            "mcptasks_redis_breaker_open", "1 while Redis is being skipped after a failure", labels=["client"]
        )
        from .layers import send_breaker

        breaker.add_metric(["counters"], int(kv.breaker.is_open))
        breaker.add_metric(["channel_layer"], int(send_breaker.is_open))
        yield breaker


REGISTRY.register(RedisPoolCollector())


def render() -> bytes:
    """The Prometheus text exposition of every metric of this process."""
    return bytes(generate_latest(REGISTRY))
