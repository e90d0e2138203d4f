"""Task states: the spec's five, and which of them are terminal or live."""

from __future__ import annotations

from django.db import models

from mcptasks.protocol.messages import TERMINAL_STATUSES
from mcptasks.protocol.messages import TaskStatus as WireStatus


class TaskStatus(models.TextChoices):
    """Task states (the spec's five)."""

    WORKING = WireStatus.WORKING.value, "working"
    INPUT_REQUIRED = WireStatus.INPUT_REQUIRED.value, "input required"
    COMPLETED = WireStatus.COMPLETED.value, "completed"
    FAILED = WireStatus.FAILED.value, "failed"
    CANCELLED = WireStatus.CANCELLED.value, "cancelled"


#: The terminal statuses (defined once, in the protocol layer) and the live ones.
TERMINAL = frozenset(s.value for s in TERMINAL_STATUSES)
LIVE = (TaskStatus.WORKING.value, TaskStatus.INPUT_REQUIRED.value)
