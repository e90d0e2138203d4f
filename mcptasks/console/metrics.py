"""Prometheus metrics (``GET /metrics``).

Collected at scrape time from the live objects, so a metric never drifts from what it
describes: the Redis connection pools of the channel layer and of the counters client, and,
from the store (the same answer from every web process), tasks by tenant and status, queue
depth, workers alive and recent task durations per tool. Refusals are counted by this process
as they happen (``mcptasks_refusals_total``; sum over processes), and so are those the audit
throttle did not write (``mcptasks_audit_suppressed_total``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from channels.layers import get_channel_layer
from prometheus_client import CollectorRegistry, Counter, ProcessCollector, generate_latest
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
        from .layers import send_breaker

        breaker.add_metric(["counters"], int(kv.breaker.is_open))
        breaker.add_metric(["channel_layer"], int(send_breaker.is_open))
        yield breaker
        from .layers import redis_degraded

        degraded = GaugeMetricFamily(
            "mcptasks_degraded",
            "1 while this process serves without a component (readiness says `degraded`; see docs/operations.md)",
            labels=["component"],
        )
        degraded.add_metric(["redis"], int(redis_degraded()))
        yield degraded


#: Django database connections of this process (one per thread that used the ORM), weakly held.
_db_connections: weakref.WeakSet[Any] = weakref.WeakSet()
#: Thread-name prefixes of the pools that hold PostgreSQL connections, and the pool they count in.
_DB_POOLS = (("mcptasks-write", "write_threads"), ("mcptasks-sync", "sync_threads"), ("mcptasks-tool", "tool_threads"),
             ("mcptasks-lease", "worker_lease_threads"))


def track_db_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created``: remember the wrapper and the pool of the thread that opened it."""
    name = threading.current_thread().name
    connection._mcptasks_pool = next((pool for prefix, pool in _DB_POOLS if name.startswith(prefix)), "other")
    _db_connections.add(connection)


class DbPoolCollector(Collector):
    """Open PostgreSQL connections of the process per pool, and each pool's bound (from settings).

    ``other`` is the thread every ORM call from async code shares (and management commands);
    ``async_reads`` the async connections of ``mcptasks/fastreads.py`` (one per event loop).
    """

    def collect(self) -> Iterator[Any]:
        """``mcptasks_db_connections_open{pool}`` and ``mcptasks_db_pool_max_connections{pool}``."""
        from django.conf import settings as dj_settings

        from . import conf, fastreads

        counts: dict[str, int] = {}
        for wrapper in list(_db_connections):
            if getattr(wrapper, "connection", None) is not None:
                pool = getattr(wrapper, "_mcptasks_pool", "other")
                counts[pool] = counts.get(pool, 0) + 1
        counts["async_reads"] = sum(1 for c in list(fastreads._conns.values()) if not getattr(c, "closed", True))
        opened = GaugeMetricFamily("mcptasks_db_connections_open", "Database connections this process has open",
                                   labels=["pool"])
        for pool, n in sorted(counts.items()):
            opened.add_metric([pool], n)
        yield opened
        s = conf.get()
        postgres = "postgresql" in dj_settings.DATABASES["default"]["ENGINE"]
        bounds = {"other": 1, "sync_threads": s.SYNC_THREADS,
                  "write_threads": s.WRITE_THREADS if postgres else 0,
                  "async_reads": 1 if postgres and s.ASYNC_READS else 0}
        maxima = GaugeMetricFamily("mcptasks_db_pool_max_connections",
                                   "Most database connections each pool may hold (per event loop for async_reads; "
                                   "a worker adds its concurrency in tool_threads and one lease thread)",
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
        from . import webhooks

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


#: Counters of live objects, by kind, registered by the modules that hold them.
_object_counts: dict[str, Callable[[], int]] = {}
_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def count_objects(kind: str, count: Callable[[], int]) -> None:
    """Report ``count()`` as ``mcptasks_process_objects{kind=...}`` at every scrape."""
    _object_counts[kind] = count


def note_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Count the asyncio tasks of ``loop`` (the server's event loop) at every scrape."""
    _loops.add(loop)


def process_objects() -> dict[str, int]:
    """Live objects of this process by kind: what would grow if something leaked."""
    counts = {kind: int(count()) for kind, count in list(_object_counts.items())}
    counts["asyncio_tasks"] = sum(len(asyncio.all_tasks(loop)) for loop in list(_loops) if not loop.is_closed())
    stats = getattr(get_channel_layer(), "buffer_stats", None)
    if callable(stats):
        for kind, value in stats().items():
            counts[f"layer_{kind}"] = value
    return counts


class ProcessObjectsCollector(Collector):
    """``mcptasks_process_objects{kind}``: streams, asyncio tasks, channel-layer buffers..."""

    def collect(self) -> Iterator[Any]:
        """One gauge, labelled by kind."""
        family = GaugeMetricFamily("mcptasks_process_objects", "Live objects this process holds, by kind",
                                   labels=["kind"])
        for kind, value in sorted(process_objects().items()):
            family.add_metric([kind], value)
        yield family


REGISTRY.register(RedisPoolCollector())
REGISTRY.register(DbPoolCollector())
REGISTRY.register(StoreCollector())
REGISTRY.register(ProcessObjectsCollector())
#: process_resident_memory_bytes and friends, of the web process serving the scrape.
ProcessCollector(registry=REGISTRY)

#: Every refusal this process sent, by kind (not throttled, unlike their audit events).
REFUSALS = Counter("mcptasks_refusals", "Refusals sent by this process", ["kind"], registry=REGISTRY)
#: Refusals this process did not write to the audit log (the throttle; counted in ``audit.suppressed``).
SUPPRESSED = Counter("mcptasks_audit_suppressed", "Refusals this process counted instead of auditing",
                     ["kind"], registry=REGISTRY)


def render() -> bytes:
    """The Prometheus text exposition of every metric of this process."""
    return bytes(generate_latest(REGISTRY))
