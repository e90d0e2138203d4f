"""Admin of tenants, their principals, members and applications."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from tenants import access, roles
from tenants.admin.scoping import TENANT_FILTER, ScopedAuditedAdmin, ScopedForeignKeys
from tenants.models import (
    ExternalIssuer,
    Principal,
    Tenant,
    TenantApplication,
    TenantMembership,
)


class PrincipalInline(ScopedForeignKeys, admin.TabularInline):
    """A tenant's principals, read on the tenant page."""

    model = Principal
    extra = 0
    fields = ("kind", "identifier", "name", "active_tasks")
    readonly_fields = ("active_tasks",)


class MembershipInline(ScopedForeignKeys, admin.TabularInline):
    """A tenant's members and their roles (scopes for MCP tokens, operator role)."""

    model = TenantMembership
    extra = 0
    fields = ("user", "role", "allowed_scopes", "created_at")
    readonly_fields = ("created_at",)
    raw_id_fields = ("user",)


class ApplicationInline(ScopedForeignKeys, admin.TabularInline):
    """A tenant's OAuth applications (their secrets are never shown: DOT stores a hash)."""

    model = TenantApplication
    extra = 0
    fields = ("application", "principal", "allowed_scopes", "created_at")
    readonly_fields = ("application", "created_at")
    raw_id_fields = ("principal",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Applications are created with ``mcptasks_tenant client`` (it prints the secret once)."""
        return False


class IssuerInline(ScopedForeignKeys, admin.TabularInline):
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
        return super().has_add_permission(request) and access.managed_tenant_ids(request.user) is None

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """Suspension, slug, quotas, rate limits and ttl bounds are the operator's decision.

        A tenant admin sees them read-only; read-only fields are not part of the form, so a
        forged POST that includes them changes nothing.
        """
        fields = tuple(super().get_readonly_fields(request, obj))
        if access.managed_tenant_ids(request.user) is None:
            return fields
        return fields + tuple(f for f in roles.OPERATOR_ONLY_TENANT_FIELDS if f not in fields)


@admin.register(Principal)
class PrincipalAdmin(ScopedAuditedAdmin):
    list_display = ("name", "identifier", "issuer", "kind", "tenant", "active_tasks", "created_at")
    list_filter = ("kind", TENANT_FILTER)
    search_fields = ("identifier", "name", "tenant__slug")
    readonly_fields = ("active_tasks", "created_at")


@admin.register(TenantApplication)
class TenantApplicationAdmin(ScopedAuditedAdmin):
    list_display = ("application", "tenant", "principal", "allowed_scopes", "created_at")
    list_filter = (TENANT_FILTER,)
    search_fields = ("application__name", "application__client_id", "tenant__slug")
    raw_id_fields = ("application", "principal")
    readonly_fields = ("created_at",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """Which OAuth application a link is, is the operator's (``mcptasks_tenant client``)."""
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if access.managed_tenant_ids(request.user) is None else (*fields, "application")


@admin.register(TenantMembership)
class TenantMembershipAdmin(ScopedAuditedAdmin):
    list_display = ("user", "tenant", "role", "allowed_scopes", "created_at")
    list_filter = (TENANT_FILTER,)
    search_fields = ("user__username", "tenant__slug")
    raw_id_fields = ("user",)
    readonly_fields = ("created_at",)
