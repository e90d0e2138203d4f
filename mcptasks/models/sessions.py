"""MCP sessions, stored so any web process can serve them."""

from __future__ import annotations

import secrets

from django.db import models


def new_session_id() -> str:
    """256 random bits, URL-safe: visible ASCII only, as the transport requires."""
    return secrets.token_urlsafe(32)


class McpSession(models.Model):
    """One MCP session (``Mcp-Session-Id``); stored so any daphne process can serve it."""

    id = models.CharField(primary_key=True, max_length=64, default=new_session_id, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="mcp_sessions")
    principal = models.ForeignKey("tenants.Principal", on_delete=models.CASCADE, related_name="mcp_sessions")
    protocol_version = models.CharField(max_length=16)
    client_info = models.JSONField(default=dict)
    client_capabilities = models.JSONField(default=dict)
    log_level = models.CharField(max_length=16, default="info")
    subscriptions = models.JSONField(default=list)
    initialized = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(auto_now_add=True, db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "MCP session"

    def __str__(self) -> str:
        return f"session {self.id[:8]}…"
