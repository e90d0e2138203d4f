"""Admin of a tenant's trusted external JWT issuers."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from tenants import access
from tenants import conf as tenant_conf
from tenants.admin.scoping import TENANT_FILTER, ScopedAuditedAdmin
from tenants.conf import normalize_uri, same_resource, shared_resource, tenant_resource
from tenants.models import (
    ExternalIssuer,
)


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

    #: The request of the operator filling the form (set by ExternalIssuerAdmin.get_form).
    operator_request: HttpRequest | None = None

    def clean(self) -> dict[str, Any]:
        """Apply the clear checkbox; hold a tenant admin to its own tenant's identity providers."""
        data = super().clean() or {}
        if data.get("clear_shared_secret"):
            data["shared_secret"] = ""
            self.instance.shared_secret = ""
        request = self.operator_request
        if request is not None and access.managed_tenant_ids(request.user) is not None:
            self._tenant_admin_rules(request, data)
        return data

    def _tenant_admin_rules(self, request: HttpRequest, data: dict[str, Any]) -> None:
        tenant = data.get("tenant") or (self.instance.tenant if self.instance.tenant_id else None)
        issuer = data.get("issuer")
        if tenant is None:
            return
        if issuer and trusted_elsewhere(issuer, tenant.pk):
            # Which tenant is never said: another tenant's row is indistinguishable from none.
            self.add_error("issuer", "Only an operator can add or change this issuer: ask your operator.")
        audience = str(data.get("audience") or "")
        if audience and not same_resource(normalize_uri(audience), own_endpoint(request, tenant.slug)):
            self.add_error("audience", f"Leave blank or use this tenant's endpoint, "
                                       f"{own_endpoint(request, tenant.slug)}.")


def trusted_elsewhere(issuer: str, tenant_id: int) -> bool:
    """Whether a tenant other than ``tenant_id`` has a row for ``issuer`` (such rows are operator-only)."""
    return ExternalIssuer.objects.filter(issuer=issuer).exclude(tenant_id=tenant_id).exists()


def own_endpoint(request: HttpRequest, slug: str) -> str:
    """The canonical URI of tenant ``slug``'s endpoint as this request sees the server."""
    here = request.build_absolute_uri(tenant_conf.get().MCP_PATH)
    return tenant_resource(shared_resource(here), slug)


@admin.register(ExternalIssuer)
class ExternalIssuerAdmin(ScopedAuditedAdmin):
    form = ExternalIssuerForm
    list_display = ("issuer", "tenant", "active", "audience", "tenant_claim", "principal_claim", "algorithms")
    list_filter = ("active", TENANT_FILTER)
    search_fields = ("issuer", "tenant__slug", "name")
    readonly_fields = ("created_at",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """``jwks_url`` is operator-only: it makes the server call a URL (see tenants.outbound)."""
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if access.managed_tenant_ids(request.user) is None else (*fields, "jwks_url")

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """The form, knowing its operator (a tenant admin's rules depend on it)."""
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"operator_request": request})

    def _operator_only(self, request: HttpRequest, obj: Any) -> bool:
        # A row whose issuer another tenant trusts too decides which tokens reach which
        # tenant: only operators of every tenant change it.
        return (obj is not None and access.managed_tenant_ids(request.user) is not None
                and trusted_elsewhere(obj.issuer, obj.tenant_id))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Also: rows of an issuer another tenant trusts are operator-only."""
        return super().has_change_permission(request, obj) and not self._operator_only(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Also: rows of an issuer another tenant trusts are operator-only."""
        return super().has_delete_permission(request, obj) and not self._operator_only(request, obj)
