"""Worker liveness rows."""

from __future__ import annotations

from django.db import models


class WorkerHeartbeat(models.Model):
    """A live worker process; stale rows show operators which workers died."""

    worker_id = models.CharField(primary_key=True, max_length=64)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    concurrency = models.IntegerField()
    running = models.IntegerField(default=0)
    started_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(db_index=True)
    stopping = models.BooleanField(default=False)
    #: The process's resident memory and asyncio task count at its last heartbeat (``/metrics``).
    rss_bytes = models.BigIntegerField(default=0)
    asyncio_tasks = models.IntegerField(default=0)
    #: Whether the worker waits for ``NOTIFY`` wake-ups (it has free slots and found no backlog).
    #: A creation notifies only while some worker does (:mod:`mcptasks.db.wakeups`); a worker
    #: whose slots stay full claims as its runs end and sets this false. True for a new row.
    wants_wakeups = models.BooleanField(default=True, db_default=True)

    def __str__(self) -> str:
        return self.worker_id
