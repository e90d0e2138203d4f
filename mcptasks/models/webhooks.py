"""The webhook outbox: one row per task event per endpoint."""

from __future__ import annotations

import secrets

from django.db import models
from django.db.models import Q
from django.utils import timezone


def new_webhook_message_id() -> str:
    """The ``webhook-id`` of one event: stable across retries, so receivers can deduplicate."""
    return "msg_" + secrets.token_urlsafe(18)


class WebhookDelivery(models.Model):
    """One task event for one webhook endpoint: the transactional outbox row.

    Written in the transaction of the task's transition (:mod:`mcptasks.streams.webhooks`), so a
    committed transition always has its deliveries and a rolled-back one has none. Workers
    claim due rows with ``FOR UPDATE SKIP LOCKED`` and a lease.
    """

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed (gave up)"

    id = models.BigAutoField(primary_key=True)
    endpoint = models.ForeignKey("tenants.WebhookEndpoint", on_delete=models.CASCADE, related_name="deliveries")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    msg_id = models.CharField(max_length=64, unique=True, default=new_webhook_message_id, editable=False)
    task_id = models.CharField(max_length=64)
    event = models.CharField(max_length=32)
    payload = models.JSONField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.IntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    worker_id = models.CharField(max_length=64, blank=True)
    last_status_code = models.IntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    #: The first bytes of the receiver's last response, for operators (never more).
    response_excerpt = models.CharField(max_length=200, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        indexes = [
            models.Index(fields=["next_attempt_at"], name="webhook_due_idx", condition=Q(state="pending")),
            models.Index(fields=["endpoint", "task_id", "id"], name="webhook_task_order_idx"),
        ]
        permissions = [("redeliver_webhookdelivery", "Can redeliver a webhook delivery (audited)")]

    def __str__(self) -> str:
        return f"{self.event} {self.task_id[:8]}… {self.state}"
