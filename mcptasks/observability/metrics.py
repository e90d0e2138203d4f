"""The process's Prometheus metric objects: what any layer records into.

Low in the import order on purpose: the endpoint, the audit throttle and the worker count here
(refusals, suppressed audit writes, live objects, database connections) without importing the
console. ``GET /metrics`` and the collectors that read the store, dashboards and connection
pools at scrape time are in :mod:`mcptasks.console.metrics`, registered in :data:`REGISTRY`.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from channels.layers import get_channel_layer
from prometheus_client import CollectorRegistry, Counter, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

#: What ``/metrics`` serves (a registry of our own: no default process collectors twice).
REGISTRY = CollectorRegistry(auto_describe=True)

#: Every refusal this process sent, by kind (not throttled, unlike their audit events).
REFUSALS = Counter("mcptasks_refusals", "Refusals sent by this process", ["kind"], registry=REGISTRY)
#: Refusals this process did not write to the audit log (the throttle; counted in ``audit.suppressed``).
SUPPRESSED = Counter("mcptasks_audit_suppressed", "Refusals this process counted instead of auditing",
                     ["kind"], registry=REGISTRY)


# --- database connections ----------------------------------------------------------------------

#: Django database connections of this process (one per thread that used the ORM), weakly held.
db_connections: weakref.WeakSet[Any] = weakref.WeakSet()
#: Thread-name prefixes of the pools that hold PostgreSQL connections, and the pool they count in.
_DB_POOLS = (("mcptasks-write", "write_threads"), ("mcptasks-sync", "sync_threads"), ("mcptasks-tool", "tool_threads"),
             ("mcptasks-lease", "worker_lease_threads"))


def track_db_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created``: remember the wrapper and the pool of the thread that opened it."""
    name = threading.current_thread().name
    connection._mcptasks_pool = next((pool for prefix, pool in _DB_POOLS if name.startswith(prefix)), "other")
    db_connections.add(connection)


# --- live objects ------------------------------------------------------------------------------

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


REGISTRY.register(ProcessObjectsCollector())
#: process_resident_memory_bytes and friends, of the web process serving the scrape.
ProcessCollector(registry=REGISTRY)
