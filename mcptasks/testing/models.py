"""A database-side record of tool runs, so tests can prove what ran where and when."""

from django.db import models


class RunRecord(models.Model):
    """One event (start/end) of one attempt of a test tool."""

    task_key = models.CharField(max_length=100, db_index=True)
    attempt = models.IntegerField()
    event = models.CharField(max_length=10)
    at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.task_key} #{self.attempt} {self.event}"
