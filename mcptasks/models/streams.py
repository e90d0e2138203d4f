"""Stored SSE events and the per-stream sequence counters that keep them gap-free."""

from __future__ import annotations

from django.db import models


class StreamEvent(models.Model):
    """An SSE event, kept for a retention window so a reconnecting client can replay its stream.

    ``seq`` numbers the events of one stream 1, 2, 3, ... without gaps (see :class:`StreamCursor`),
    so a connection that receives event n+2 before n+1 knows n+1 exists and fetches it.
    """

    id = models.BigAutoField(primary_key=True)
    session_id = models.CharField(max_length=64)
    stream_id = models.CharField(max_length=64)
    seq = models.BigIntegerField(default=0)
    data = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["stream_id", "seq"], name="streamevent_stream_seq_uniq")]

    def __str__(self) -> str:
        return self.event_id

    @property
    def event_id(self) -> str:
        """The SSE ``id``: names the stream so Last-Event-ID finds it."""
        return f"{self.stream_id}.{self.seq}"


class StreamCursor(models.Model):
    """The last sequence number handed out on a stream.

    Appending locks this row, so sequence numbers are gap-free and commit in order; it outlives
    the stream's events (retention) so numbers never restart while a client may resume.
    """

    stream_id = models.CharField(primary_key=True, max_length=64)
    session_id = models.CharField(max_length=64, db_index=True)
    last_seq = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)
    # A tasks/result stream remembers which task and request id it answers for as long as the
    # stream may be resumed (the row lives as long as its session), not in an event that
    # retention deletes: a client can resume it however long the task runs.
    task_id = models.CharField(max_length=64, blank=True, default="")
    rpc_id = models.JSONField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.stream_id}@{self.last_seq}"
