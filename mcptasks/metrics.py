"""Prometheus metrics (``GET /metrics``).

Collected at scrape time from the live objects, so a metric never drifts from what it
describes: the Redis connection pools of the channel layer and of the counters client, and,
from the store (the same answer from every web process), tasks by tenant and status, queue
depth, workers alive and recent task durations per tool. Refusals are counted by this process
as they happen (``mcptasks_refusals_total``; sum over processes).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from channels.layers import get_channel_layer
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tenants import kv

logger = logging.getLogger(__name__)

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


class StoreCollector(Collector):
    """Task and worker figures read from the database at scrape time."""

    def describe(self) -> list[Any]:
        """Nothing up front: registering must not query the database (it may not exist yet)."""
        return []

    def collect(self) -> Iterator[Any]:
        """The store's figures, and ``mcptasks_store_up`` (0 when the database did not answer)."""
        try:
            families = list(self._families())
        except Exception as exc:
            # /metrics still serves the process's own figures while the database is away.
            logger.warning("metrics: database unavailable: %s", type(exc).__name__)
            families = []
        yield GaugeMetricFamily("mcptasks_store_up", "1 when the database answered this scrape",
                                value=1 if families else 0)
        yield from families

    def _families(self) -> Iterator[Any]:
        """Tasks by tenant and status, queue depth, workers alive, durations per tool."""
        import datetime as dt

        from django.db.models import Count
        from django.utils import timezone

        from . import dashboard, selectors
        from .models import LIVE, Task, TaskStatus

        now = timezone.now()
        tasks = Task.objects.filter(kind=Task.Kind.TASK)
        by_status = GaugeMetricFamily("mcptasks_tasks", "Stored tasks by tenant and status",
                                      labels=["tenant", "status"])
        for row in tasks.values("tenant__slug", "status").annotate(n=Count("pk")).order_by():
            by_status.add_metric([row["tenant__slug"] or "", row["status"]], row["n"])
        yield by_status
        yield GaugeMetricFamily("mcptasks_queue_depth", "Working tasks no worker holds yet",
                                value=tasks.filter(status=TaskStatus.WORKING, worker_id__isnull=True).count())
        yield GaugeMetricFamily("mcptasks_live_tasks", "Tasks working or waiting for input",
                                value=tasks.filter(status__in=LIVE).count())
        yield GaugeMetricFamily("mcptasks_workers_alive", "Workers with a heartbeat within one lease",
                                value=selectors.alive_workers(now=now).count())
        durations = GaugeMetricFamily("mcptasks_task_duration_seconds",
                                      "Creation-to-end time of tasks finished in the last hour, per tool",
                                      labels=["tool", "quantile"])
        per_tool = dashboard.durations_per_tool(tasks, since=now - dt.timedelta(hours=1))
        for tool, values in sorted(per_tool.items()):
            for q in (0.5, 0.95):
                durations.add_metric([tool, str(q)], dashboard.percentile(values, q))
        yield durations


REGISTRY.register(RedisPoolCollector())
REGISTRY.register(StoreCollector())

#: Every refusal this process sent, by kind (not throttled, unlike their audit events).
REFUSALS = Counter("mcptasks_refusals", "Refusals sent by this process", ["kind"], registry=REGISTRY)


def render() -> bytes:
    """The Prometheus text exposition of every metric of this process."""
    return bytes(generate_latest(REGISTRY))
