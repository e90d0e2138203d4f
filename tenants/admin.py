"""Admin for tenants: limits are edited here at run time and apply within seconds.

Every admin of both apps is *tenant-scoped* (operators see the tenants :mod:`tenants.roles`
gives them, and change only those they manage) and *audited* (every add, change and delete is an
audit event naming the operator, the object and each changed field before and after; secrets
are never written, only that they changed).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from . import roles
from .crypto import EncryptedTextField
from .models import ExternalIssuer, Principal, Tenant, TenantApplication, TenantMembership
from .signals import emit

#: Lists only tenants the operator can see (the plain filter would name every tenant).
TENANT_FILTER = ("tenant", admin.RelatedOnlyFieldListFilter)

#: Field names whose values never reach the audit log (only "changed").
_SECRET_WORDS = ("secret", "password", "token", "key")
_MAX_AUDIT_VALUE = 200


def _is_secret(field: models.Field[Any, Any] | None, name: str) -> bool:
    return isinstance(field, EncryptedTextField) or any(w in name.lower() for w in _SECRET_WORDS)


def _audit_value(value: Any) -> Any:
    if isinstance(value, models.Model):
        return str(value.pk)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if value is None or isinstance(value, bool | int | float):
        return value
    text = str(value)
    return text if len(text) <= _MAX_AUDIT_VALUE else text[:_MAX_AUDIT_VALUE] + "…"


class ScopedAuditedAdmin(admin.ModelAdmin):
    """Rows limited to the operator's tenants; every write recorded in the audit trail.

    ``tenant_field`` names the lookup to the tenant id (``"pk"`` on the Tenant admin itself).
    """

    tenant_field = "tenant_id"

    # --- scope --------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> Any:
        """Only the tenants the operator may see."""
        return roles.scope_queryset(super().get_queryset(request), roles.visible_tenant_ids(request.user),
                                    field=self.tenant_field)

    def _tenant_of(self, obj: Any) -> int | None:
        # Also called for inline rows (a principal on a tenant's page): their own tenant.
        if isinstance(obj, Tenant):
            return int(obj.pk) if obj.pk is not None else None
        value = getattr(obj, "tenant_id", None)
        return int(value) if value is not None else None

    def _manages(self, request: HttpRequest, obj: Any) -> bool:
        managed = roles.managed_tenant_ids(request.user)
        return managed is None or obj is None or self._tenant_of(obj) in managed

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Model permission, and the object's tenant managed by the operator."""
        return super().has_change_permission(request, obj) and self._manages(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Model permission, and the object's tenant managed by the operator."""
        return super().has_delete_permission(request, obj) and self._manages(request, obj)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        """A tenant admin can only pick the tenants they manage (and their principals)."""
        managed = roles.managed_tenant_ids(request.user)
        if managed is not None and db_field.related_model is Tenant:
            kwargs["queryset"] = Tenant.objects.filter(pk__in=managed)
        elif managed is not None and db_field.related_model is Principal:
            kwargs["queryset"] = Principal.objects.filter(tenant_id__in=managed)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Refuse saving into a tenant the operator does not manage (a forged POST), then audit."""
        if not self._manages(request, obj):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        before = type(obj).objects.filter(pk=obj.pk).first() if change and obj.pk else None
        super().save_model(request, obj, form, change)
        self._audit(request, obj, "admin.change" if change else "admin.add", before=before,
                    fields=list(getattr(form, "changed_data", []) or []))

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        """Delete, then audit."""
        tenant_id = self._tenant_of(obj)
        label = str(obj)
        super().delete_model(request, obj)
        self._emit(request, "admin.delete", tenant_id, obj, label, {})

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        """Bulk delete, one audit event per object."""
        for obj in list(queryset):
            self.delete_model(request, obj)

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        """Inline rows (members, principals... on a tenant's page) are scoped and audited too."""
        befores = {f.instance.pk: type(f.instance).objects.filter(pk=f.instance.pk).first()
                   for f in formset.forms if f.instance.pk and f.has_changed()}
        # No scope check per row: an inline's tenant is its parent's (checked with the parent).
        deleted = [(o, self._tenant_of(o), str(o)) for o in getattr(formset, "deleted_objects", [])]
        super().save_formset(request, form, formset, change)
        for f in formset.forms:
            if f.instance.pk is None or not f.has_changed() or f in getattr(formset, "deleted_forms", []):
                continue
            before = befores.get(f.instance.pk)
            self._audit(request, f.instance, "admin.change" if before is not None else "admin.add", before=before,
                        fields=list(f.changed_data))
        for obj, tenant_id, label in deleted:
            self._emit(request, "admin.delete", tenant_id, obj, label, {})

    # --- audit --------------------------------------------------------------------------

    def _audit(self, request: HttpRequest, obj: Any, action: str, *, before: Any, fields: list[str]) -> None:
        changes: dict[str, Any] = {}
        for name in fields:
            try:
                field = obj._meta.get_field(name)
            except Exception:
                field = None  # a form-only field (e.g. "clear_shared_secret")
            if _is_secret(field, name):
                changes[name] = "(secret changed)"
                continue
            if field is None:
                continue
            attname = getattr(field, "attname", name)
            changes[name] = {
                "before": _audit_value(getattr(before, attname, None)) if before is not None else None,
                "after": _audit_value(getattr(obj, attname, None)),
            }
        self._emit(request, action, self._tenant_of(obj), obj, str(obj), changes)

    def _emit(self, request: HttpRequest, action: str, tenant_id: int | None, obj: Any, label: str,
              changes: dict[str, Any]) -> None:
        emit(action=action, tenant_id=tenant_id, data={
            "operator": str(getattr(request.user, "get_username", lambda: "")())[:150],
            "operator_id": getattr(request.user, "pk", None),
            "model": obj._meta.label_lower, "object_id": str(obj.pk), "object": label[:_MAX_AUDIT_VALUE],
            "changes": changes,
        })


class PrincipalInline(admin.TabularInline):
    """A tenant's principals, read on the tenant page."""

    model = Principal
    extra = 0
    fields = ("kind", "identifier", "name", "active_tasks")
    readonly_fields = ("active_tasks",)


class MembershipInline(admin.TabularInline):
    """A tenant's members and their roles (scopes for MCP tokens, operator role)."""

    model = TenantMembership
    extra = 0
    fields = ("user", "role", "allowed_scopes", "created_at")
    readonly_fields = ("created_at",)
    raw_id_fields = ("user",)


class ApplicationInline(admin.TabularInline):
    """A tenant's OAuth applications (their secrets are never shown: DOT stores a hash)."""

    model = TenantApplication
    extra = 0
    fields = ("application", "principal", "allowed_scopes", "created_at")
    readonly_fields = ("application", "created_at")
    raw_id_fields = ("principal",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Applications are created with ``mcptasks_tenant client`` (it prints the secret once)."""
        return False


class IssuerInline(admin.TabularInline):
    """A tenant's external identity providers (edited on their own page: the secret is write-only)."""

    model = ExternalIssuer
    extra = 0
    fields = ("issuer", "name", "active", "audience", "algorithms")
    readonly_fields = fields
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Added on the issuer page, where the shared secret is write-only."""
        return False


@admin.register(Tenant)
class TenantAdmin(ScopedAuditedAdmin):
    tenant_field = "pk"
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
    inlines = [PrincipalInline, MembershipInline, ApplicationInline, IssuerInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Only operators of every tenant create tenants."""
        return super().has_add_permission(request) and roles.managed_tenant_ids(request.user) is None


@admin.register(Principal)
class PrincipalAdmin(ScopedAuditedAdmin):
    list_display = ("name", "identifier", "issuer", "kind", "tenant", "active_tasks", "created_at")
    list_filter = ("kind", TENANT_FILTER)
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
class ExternalIssuerAdmin(ScopedAuditedAdmin):
    form = ExternalIssuerForm
    list_display = ("issuer", "tenant", "active", "audience", "tenant_claim", "principal_claim", "algorithms")
    list_filter = ("active", TENANT_FILTER)
    search_fields = ("issuer", "tenant__slug", "name")
    readonly_fields = ("created_at",)


@admin.register(TenantApplication)
class TenantApplicationAdmin(ScopedAuditedAdmin):
    list_display = ("application", "tenant", "principal", "allowed_scopes", "created_at")
    list_filter = (TENANT_FILTER,)
    search_fields = ("application__name", "application__client_id", "tenant__slug")
    raw_id_fields = ("application", "principal")
    readonly_fields = ("created_at",)


@admin.register(TenantMembership)
class TenantMembershipAdmin(ScopedAuditedAdmin):
    list_display = ("user", "tenant", "role", "allowed_scopes", "created_at")
    list_filter = (TENANT_FILTER,)
    search_fields = ("user__username", "tenant__slug")
    raw_id_fields = ("user",)
    readonly_fields = ("created_at",)
