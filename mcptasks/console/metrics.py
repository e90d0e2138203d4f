"""Prometheus metrics (``GET /metrics``): the view's rendering and the scrape-time collectors.

The metric objects that other layers record into (refusals, suppressed audit writes, live
objects, database connections) are in :mod:`mcptasks.observability.metrics`; this module
registers the collectors that read the store, the dashboards and the pools into its registry.
Collected at scrape time from the live objects, so a metric never drifts from what it
describes: the Redis connection pools of the channel layer and of the counters client, and,
from the store (the same answer from every web process), tasks by tenant and status, queue
depth, workers alive and recent task durations per tool. Refusals are counted by this process
as they happen (``mcptasks_refusals_total``; sum over processes), and so are those the audit
throttle did not write (``mcptasks_audit_suppressed_total``).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings as dj_settings
from django.db.models import Count
from django.utils import timezone
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mcptasks import conf
from mcptasks.console import dashboard
from mcptasks.db import async_sql as fastreads
from mcptasks.db import write_conns
from mcptasks.models import LIVE, Task, TaskStatus
from mcptasks.observability.metrics import REGISTRY, db_connections
from mcptasks.streams import webhooks
from mcptasks.streams.layers import redis_degraded, send_breaker
from mcptasks.tasks import selectors
from tenants import kv

logger = logging.getLogger(__name__)


class RedisPoolCollector(Collector):
    """Open, in-use and maximum connections of each Redis pool of the process."""

    def collect(self) -> Iterator[Any]:
        """One gauge family per measure, labelled by pool."""
        pools: dict[str, dict[str, int]] = {"counters": kv.pool_stats(), "counters_async": kv.apool_stats()}
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
        breaker.add_metric(["counters"], int(kv.breaker.is_open))
        breaker.add_metric(["channel_layer"], int(send_breaker.is_open))
        yield breaker
        degraded = GaugeMetricFamily(
            "mcptasks_degraded",
            "1 while this process serves without a component (readiness says `degraded`; see docs/operations.md)",
            labels=["component"],
        )
        degraded.add_metric(["redis"], int(redis_degraded()))
        yield degraded


class DbPoolCollector(Collector):
    """Open PostgreSQL connections of the process per pool, and each pool's bound (from settings).

    ``other`` is the thread every ORM call from async code shares (and management commands);
    ``async_reads`` the async connections of ``mcptasks/db/async_sql.py`` (one per event loop),
    ``async_writes`` the pooled ones of ``mcptasks/db/write_conns.py`` (task creation).
    """

    def collect(self) -> Iterator[Any]:
        """``mcptasks_db_connections_open{pool}`` and ``mcptasks_db_pool_max_connections{pool}``."""
        counts: dict[str, int] = {}
        for wrapper in list(db_connections):
            if getattr(wrapper, "connection", None) is not None:
                pool = getattr(wrapper, "_mcptasks_pool", "other")
                counts[pool] = counts.get(pool, 0) + 1
        counts["async_reads"] = sum(1 for c in list(fastreads._conns.values()) if not getattr(c, "closed", True))
        counts["async_writes"] = write_conns.open_connections()
        opened = GaugeMetricFamily("mcptasks_db_connections_open", "Database connections this process has open",
                                   labels=["pool"])
        for pool, n in sorted(counts.items()):
            opened.add_metric([pool], n)
        yield opened
        s = conf.get()
        postgres = "postgresql" in dj_settings.DATABASES["default"]["ENGINE"]
        bounds = {"other": 1, "sync_threads": s.SYNC_THREADS,
                  "write_threads": s.WRITE_THREADS if postgres else 0,
                  "async_reads": 1 if postgres and s.ASYNC_READS else 0,
                  "async_writes": s.WRITE_THREADS if postgres and s.ASYNC_READS else 0}
        maxima = GaugeMetricFamily("mcptasks_db_pool_max_connections",
                                   "Most database connections each pool may hold (per event loop for async_reads "
                                   "and async_writes; a worker adds its concurrency in tool_threads and one lease "
                                   "thread)",
                                   labels=["pool"])
        for pool, n in bounds.items():
            maxima.add_metric([pool], n)
        yield maxima


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
        alive = list(selectors.alive_workers(now=now).values("worker_id", "rss_bytes", "asyncio_tasks"))
        yield GaugeMetricFamily("mcptasks_workers_alive", "Workers with a heartbeat within one lease",
                                value=len(alive))
        rss = GaugeMetricFamily("mcptasks_worker_resident_memory_bytes",
                                "Resident memory of each live worker at its last heartbeat", labels=["worker"])
        tasks_now = GaugeMetricFamily("mcptasks_worker_asyncio_tasks",
                                      "asyncio tasks of each live worker at its last heartbeat", labels=["worker"])
        for row in alive:
            rss.add_metric([row["worker_id"]], row["rss_bytes"])
            tasks_now.add_metric([row["worker_id"]], row["asyncio_tasks"])
        yield rss
        yield tasks_now
        durations = GaugeMetricFamily("mcptasks_task_duration_seconds",
                                      "Creation-to-end time of tasks finished in the last hour, per tool",
                                      labels=["tool", "quantile"])
        per_tool = dashboard.durations_per_tool(tasks, since=now - dt.timedelta(hours=1))
        for tool, values in sorted(per_tool.items()):
            for q in (0.5, 0.95):
                durations.add_metric([tool, str(q)], dashboard.percentile(values, q))
        yield durations
        hooks = webhooks.stats()
        deliveries = GaugeMetricFamily("mcptasks_webhook_deliveries",
                                       "Stored webhook deliveries by state (delivered, failed: given up, pending)",
                                       labels=["state"])
        for state in ("delivered", "failed", "pending"):
            deliveries.add_metric([state], hooks[state])
        yield deliveries
        yield GaugeMetricFamily("mcptasks_webhook_failed_attempts",
                                "Failed webhook attempts of the stored deliveries", value=hooks["failed_attempts"])
        yield GaugeMetricFamily("mcptasks_webhook_outbox_depth", "Webhook deliveries not yet delivered nor given up",
                                value=hooks["pending"])


REGISTRY.register(RedisPoolCollector())
REGISTRY.register(DbPoolCollector())
REGISTRY.register(StoreCollector())


def render() -> bytes:
    """The Prometheus text exposition of every metric of this process."""
    return bytes(generate_latest(REGISTRY))
