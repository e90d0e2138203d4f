"""What the audit-review API (:mod:`mcptasks.console.api`) shows of each row (never a task's
arguments or result, a webhook's signing secrets or a delivery's payload)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from mcptasks.console import operators
from mcptasks.models import AuditEvent, Task, WebhookDelivery
from tenants import access
from tenants.models import WebhookEndpoint


@extend_schema_field({"type": "object", "nullable": True, "readOnly": True,
                      "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}})
class PrincipalField(serializers.Field):
    """A principal as ``{"id", "name"}`` (its human name, else its identifier)."""

    def to_representation(self, value: Any) -> dict[str, Any]:
        """``{"id", "name"}`` of the principal ``value``."""
        return {"id": value.pk, "name": value.name or value.identifier}


class AuditEventSerializer(serializers.ModelSerializer):
    """One audit event with its place in the tenant's chain."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    principal = PrincipalField(read_only=True)

    class Meta:
        model = AuditEvent
        fields = ("id", "created_at", "tenant", "principal", "action", "task_id", "data", "chain", "chain_seq",
                  "prev_hash", "hash", "sealed_at")


class TaskSerializer(serializers.ModelSerializer):
    """A task's state (never its arguments or result)."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    principal = PrincipalField(read_only=True)
    worker_id = serializers.SerializerMethodField()

    @extend_schema_field(OpenApiTypes.STR)
    def get_worker_id(self, obj: Task) -> str:
        """The worker's id for operators of every tenant, else an opaque label (no host or pid)."""
        request = self.context.get("request")
        user = getattr(request, "user", None)
        all_tenants = user is not None and access.visible_tenant_ids(user) is None
        return operators.worker_label(obj.worker_id, all_tenants=all_tenants)

    class Meta:
        model = Task
        fields = ("task_id", "tenant", "principal", "tool_name", "status", "status_message", "attempt", "worker_id",
                  "created_at", "last_updated_at", "finished_at", "expires_at", "ttl_ms")


class WebhookEndpointSerializer(serializers.ModelSerializer):
    """A webhook endpoint (never its signing secrets)."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    principal = PrincipalField(read_only=True)

    class Meta:
        model = WebhookEndpoint
        fields = ("id", "tenant", "principal", "url", "events", "enabled", "created_at", "last_success_at",
                  "failing_since", "disabled_reason", "previous_secret_expires_at")


class WebhookDeliverySerializer(serializers.ModelSerializer):
    """One webhook delivery's state (never its payload, which may hold a tool's result)."""

    class Meta:
        model = WebhookDelivery
        fields = ("id", "msg_id", "endpoint", "task_id", "event", "state", "attempts", "created_at",
                  "next_attempt_at", "last_status_code", "last_error", "delivered_at")
