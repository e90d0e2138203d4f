"""Admin for tenants: limits are edited here at run time and apply within seconds."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin

from .models import ExternalIssuer, Principal, Tenant, TenantApplication, TenantMembership


class PrincipalInline(admin.TabularInline):
    model = Principal
    extra = 0
    fields = ("kind", "identifier", "name", "active_tasks")
    readonly_fields = ("active_tasks",)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "active", "active_tasks", "max_concurrent_tasks", "created_at")
    list_filter = ("active",)
    search_fields = ("slug", "name")
    readonly_fields = ("active_tasks", "created_at")
    fieldsets = (
        (None, {"fields": ("slug", "name", "active", "active_tasks", "created_at")}),
        (
            "Concurrency (blank: unlimited)",
            {"fields": ("max_concurrent_tasks", "max_concurrent_tasks_per_principal")},
        ),
        (
            "Task timing (blank: global setting)",
            {"fields": ("default_ttl_ms", "max_ttl_ms", "poll_interval_ms")},
        ),
        (
            "Rate limits per minute (blank: unlimited)",
            {"fields": ("rate_create_per_min", "rate_read_per_min", "rate_other_per_min")},
        ),
    )
    inlines = [PrincipalInline]


@admin.register(Principal)
class PrincipalAdmin(admin.ModelAdmin):
    list_display = ("identifier", "issuer", "name", "kind", "tenant", "active_tasks", "created_at")
    list_filter = ("kind", "tenant")
    search_fields = ("identifier", "name", "tenant__slug")
    readonly_fields = ("active_tasks", "created_at")


class ExternalIssuerForm(forms.ModelForm):
    """The shared secret is write-only: never rendered back, kept when left blank."""

    shared_secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Only for HS* algorithms. Stored encrypted and never shown again; leave blank to keep "
        "the current one.",
    )
    clear_shared_secret = forms.BooleanField(required=False, help_text="Remove the stored shared secret.")

    class Meta:
        model = ExternalIssuer
        # Listed, not "__all__": a field added to the model later is not editable by accident.
        fields = (
            "tenant", "name", "active", "issuer", "jwks_url", "static_keys", "shared_secret", "audience",
            "tenant_claim", "tenant_claim_value", "principal_claim", "scopes_claim", "algorithms", "leeway_s",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stored_secret = self.instance.shared_secret if self.instance.pk else ""
        self.initial["shared_secret"] = ""

    def clean_shared_secret(self) -> str:
        """A blank entry keeps the stored secret (unless cleared)."""
        value = str(self.cleaned_data.get("shared_secret") or "")
        if not value and not self.data.get("clear_shared_secret"):
            return str(self._stored_secret)
        return value

    def clean(self) -> dict[str, Any]:
        """Apply the clear checkbox."""
        data = super().clean() or {}
        if data.get("clear_shared_secret"):
            data["shared_secret"] = ""
            self.instance.shared_secret = ""
        return data


@admin.register(ExternalIssuer)
class ExternalIssuerAdmin(admin.ModelAdmin):
    form = ExternalIssuerForm
    list_display = ("issuer", "tenant", "active", "audience", "tenant_claim", "principal_claim", "algorithms")
    list_filter = ("active", "tenant")
    search_fields = ("issuer", "tenant__slug", "name")
    readonly_fields = ("created_at",)


@admin.register(TenantApplication)
class TenantApplicationAdmin(admin.ModelAdmin):
    list_display = ("application", "tenant", "principal", "allowed_scopes", "created_at")
    list_filter = ("tenant",)
    search_fields = ("application__name", "application__client_id", "tenant__slug")
    raw_id_fields = ("application", "principal")
    readonly_fields = ("created_at",)


@admin.register(TenantMembership)
class TenantMembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "tenant", "allowed_scopes", "created_at")
    list_filter = ("tenant",)
    search_fields = ("user__username", "tenant__slug")
    raw_id_fields = ("user",)
    readonly_fields = ("created_at",)
