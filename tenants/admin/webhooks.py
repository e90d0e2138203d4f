"""Admin of a tenant's webhook endpoints (and their signing secrets)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest

from tenants.admin.scoping import TENANT_FILTER, ScopedAuditedAdmin
from tenants.models import (
    DEFAULT_WEBHOOK_EVENTS,
    WEBHOOK_EVENTS,
    WebhookEndpoint,
)


class WebhookEndpointForm(forms.ModelForm):
    """Events as checkboxes of the known events (the model validates the URL and the principal)."""

    events = forms.MultipleChoiceField(
        choices=[(e, e) for e in WEBHOOK_EVENTS], widget=forms.CheckboxSelectMultiple,
        initial=DEFAULT_WEBHOOK_EVENTS,
    )

    class Meta:
        model = WebhookEndpoint
        fields = ("tenant", "principal", "url", "events", "enabled")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ScopedAuditedAdmin):
    """Webhook endpoints: the signing secret is shown once (on creation, on rotation), never stored in a page."""

    form = WebhookEndpointForm
    list_display = ("url", "tenant", "principal", "enabled", "last_success_at", "failing_since", "disabled_reason")
    list_filter = (TENANT_FILTER, "enabled")
    list_select_related = ("tenant", "principal")
    raw_id_fields = ("principal",)
    readonly_fields = ("created_at", "last_success_at", "failing_since", "disabled_reason",
                       "previous_secret_expires_at")
    actions = ["rotate_secrets"]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        """Warn about endpoints disabled for failing (the operator must fix and re-enable them)."""
        disabled = self.get_queryset(request).filter(enabled=False).exclude(disabled_reason="")
        for endpoint in disabled[:10]:
            self.message_user(request, f"Webhook endpoint {endpoint.url[:80]} was disabled: "
                                       f"{endpoint.disabled_reason}", messages.WARNING)
        return super().changelist_view(request, extra_context)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Re-enabling an endpoint clears its failure record (it gets a full retry period again)."""
        if change and obj.enabled and "enabled" in (form.changed_data or []):
            obj.disabled_reason, obj.failing_since = "", None
        super().save_model(request, obj, form, change)

    def response_add(self, request: HttpRequest, obj: Any, post_url_continue: Any = None) -> Any:
        """The new endpoint's signing secret, shown this once."""
        return self._secrets_page(request, [obj], "Webhook endpoint added")

    @admin.action(description="Rotate the signing secret (the old one still signs during the overlap)",
                  permissions=["change"])
    def rotate_secrets(self, request: HttpRequest, queryset: Any) -> Any:
        """New secrets for the selected endpoints the operator manages (audited), shown once."""
        from tenants.services import rotate_webhook_secret

        rotated = []
        for endpoint in queryset.select_related("tenant"):
            if not self._manages(request, endpoint):
                continue
            rotate_webhook_secret(endpoint=endpoint)
            self._emit(request, "admin.change", endpoint.tenant_id, endpoint, str(endpoint),
                       {"secret": "(secret rotated)"})
            rotated.append(endpoint)
        return self._secrets_page(request, rotated, "Signing secrets rotated")

    def _secrets_page(self, request: HttpRequest, endpoints: list[Any], title: str) -> Any:
        from django.template.response import TemplateResponse

        response = TemplateResponse(request, "admin/tenants/webhookendpoint/secret.html", {
            **self.admin_site.each_context(request), "title": title, "endpoints": endpoints,
            "opts": self.model._meta,
        })
        response["Cache-Control"] = "no-store"
        return response
