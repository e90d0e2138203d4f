"""Admin for tenants: limits are edited here at run time and apply within seconds.

Every admin of both apps is *tenant-scoped* (operators see the tenants :mod:`tenants.roles`
gives them, and change only those they manage) and *audited* (every add, change and delete is an
audit event naming the operator, the object and each changed field before and after; secrets
are never written, only that they changed).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import oauth2_provider.admin  # noqa: F401  (DOT's admins registered first: wrapped below)
from django import forms
from django.contrib import admin, messages
from django.contrib.admin.widgets import ForeignKeyRawIdWidget
from django.contrib.auth import get_user_model
from django.core.exceptions import (
    FieldDoesNotExist,
    MultipleObjectsReturned,
    ObjectDoesNotExist,
    PermissionDenied,
    ValidationError,
)
from django.db import models
from django.http import HttpRequest
from oauth2_provider.models import get_application_model

from . import conf as tenant_conf
from . import roles
from .conf import normalize_uri, same_resource, shared_resource, tenant_resource
from .crypto import EncryptedTextField
from .models import (
    DEFAULT_WEBHOOK_EVENTS,
    WEBHOOK_EVENTS,
    ExternalIssuer,
    Principal,
    Tenant,
    TenantApplication,
    TenantMembership,
    WebhookEndpoint,
)
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


def scoped_choices(model: Any, managed: frozenset[int]) -> Any:
    """The rows of ``model`` a tenant admin of the tenants ``managed`` may name in a foreign key.

    Tenants they manage; those tenants' rows (principals, applications...); users who are
    members of them; OAuth applications linked to them. Any other model: nothing.
    """
    manager = model._default_manager
    if model is Tenant:
        return manager.filter(pk__in=managed)
    if model is get_user_model():
        return manager.filter(tenant_memberships__tenant_id__in=managed).distinct()
    if model is get_application_model():
        return manager.filter(tenant_link__tenant_id__in=managed)
    try:
        model._meta.get_field("tenant")
    except FieldDoesNotExist:
        return manager.none()
    return manager.filter(tenant_id__in=managed)


class ScopedRawIdWidget(ForeignKeyRawIdWidget):
    """A raw-id input that labels only rows of its field's (scoped) queryset.

    Django's own widget looks the posted id up in the whole table, so an invalid form echoed
    the name of any row (another tenant's principal, any user) next to the id.
    """

    def __init__(self, rel: Any, admin_site: Any, queryset: Any, attrs: Any = None, using: Any = None) -> None:
        super().__init__(rel, admin_site, attrs, using)
        self.queryset = queryset

    def label_and_url_for_value(self, value: Any) -> tuple[str, str]:
        """The label and link of ``value`` if the field could accept it, else nothing."""
        key = self.rel.get_related_field().name
        try:
            self.queryset.using(self.db).get(**{key: value})
        except (ValueError, TypeError, ValidationError, ObjectDoesNotExist, MultipleObjectsReturned):
            return "", ""
        return tuple(super().label_and_url_for_value(value))  # type: ignore[return-value]


class ScopedForeignKeys:
    """Every foreign key of an admin or inline offers, accepts and labels only the operator's tenants' rows."""

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        """Scoped queryset for tenant admins; raw-id widgets labelled from that queryset."""
        managed = roles.managed_tenant_ids(request.user)
        if managed is not None and "queryset" not in kwargs:
            kwargs["queryset"] = scoped_choices(db_field.related_model, managed)
        if db_field.name in getattr(self, "raw_id_fields", ()) and "widget" not in kwargs:
            using = kwargs.get("using")
            queryset = kwargs.get("queryset")
            if queryset is None:
                queryset = self.get_field_queryset(using, db_field, request)  # type: ignore[attr-defined]
            if queryset is None:
                queryset = db_field.related_model._default_manager.all()
            site = getattr(self, "admin_site")  # noqa: B009  (a mixin: set by ModelAdmin/InlineModelAdmin)
            kwargs["widget"] = ScopedRawIdWidget(db_field.remote_field, site, queryset, using=using)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)  # type: ignore[misc]


def check_references(request: HttpRequest, obj: Any) -> None:
    """Refuse (403) saving ``obj`` if a foreign key names a row outside the tenant admin's tenants.

    The forms already refuse such ids; this catches any path around them (a forged formset).
    """
    managed = roles.managed_tenant_ids(request.user)
    if managed is None:
        return
    for field in obj._meta.concrete_fields:
        if not field.is_relation or field.related_model is None:
            continue
        value = getattr(obj, field.attname, None)
        if value is None:
            continue
        target = field.target_field.name
        if not scoped_choices(field.related_model, managed).filter(**{target: value}).exists():
            raise PermissionDenied


class ScopedAuditedAdmin(ScopedForeignKeys, admin.ModelAdmin):
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

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Refuse saving into a tenant the operator does not manage (a forged POST), then audit."""
        if not self._manages(request, obj):
            raise PermissionDenied
        check_references(request, obj)
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
        # An inline's tenant is its parent's (checked with the parent); what its rows point
        # at (a principal, a user) is checked here.
        for f in formset.forms:
            if f.has_changed() and f not in getattr(formset, "deleted_forms", []):
                check_references(request, f.instance)
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
        return super().has_add_permission(request) and roles.managed_tenant_ids(request.user) is None

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """Suspension, slug, quotas, rate limits and ttl bounds are the operator's decision.

        A tenant admin sees them read-only; read-only fields are not part of the form, so a
        forged POST that includes them changes nothing.
        """
        fields = tuple(super().get_readonly_fields(request, obj))
        if roles.managed_tenant_ids(request.user) is None:
            return fields
        return fields + tuple(f for f in roles.OPERATOR_ONLY_TENANT_FIELDS if f not in fields)


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

    #: The request of the operator filling the form (set by ExternalIssuerAdmin.get_form).
    operator_request: HttpRequest | None = None

    def clean(self) -> dict[str, Any]:
        """Apply the clear checkbox; hold a tenant admin to its own tenant's identity providers."""
        data = super().clean() or {}
        if data.get("clear_shared_secret"):
            data["shared_secret"] = ""
            self.instance.shared_secret = ""
        request = self.operator_request
        if request is not None and roles.managed_tenant_ids(request.user) is not None:
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
        return fields if roles.managed_tenant_ids(request.user) is None else (*fields, "jwks_url")

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """The form, knowing its operator (a tenant admin's rules depend on it)."""
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"operator_request": request})

    def _operator_only(self, request: HttpRequest, obj: Any) -> bool:
        # A row whose issuer another tenant trusts too decides which tokens reach which
        # tenant: only operators of every tenant change it.
        return (obj is not None and roles.managed_tenant_ids(request.user) is not None
                and trusted_elsewhere(obj.issuer, obj.tenant_id))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Also: rows of an issuer another tenant trusts are operator-only."""
        return super().has_change_permission(request, obj) and not self._operator_only(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Also: rows of an issuer another tenant trusts are operator-only."""
        return super().has_delete_permission(request, obj) and not self._operator_only(request, obj)


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
        return fields if roles.managed_tenant_ids(request.user) is None else (*fields, "application")


@admin.register(TenantMembership)
class TenantMembershipAdmin(ScopedAuditedAdmin):
    list_display = ("user", "tenant", "role", "allowed_scopes", "created_at")
    list_filter = (TENANT_FILTER,)
    search_fields = ("user__username", "tenant__slug")
    raw_id_fields = ("user",)
    readonly_fields = ("created_at",)



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
        from .services import rotate_webhook_secret

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


class OperatorOnly:
    """django-oauth-toolkit's own admins (every tenant's applications, tokens and grants): superusers only.

    Their rows are not tenant-scoped, so no tenant admin or auditor may open them even if an
    operator hands out the model permissions; tenants' applications are edited through
    :class:`TenantApplicationAdmin` and the tenant page instead.
    """

    def has_module_permission(self, request: HttpRequest) -> bool:
        """Superusers only."""
        return bool(request.user.is_superuser) and super().has_module_permission(request)  # type: ignore[misc]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Superusers only."""
        return bool(request.user.is_superuser) and super().has_view_permission(request, obj)  # type: ignore[misc]

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        """Superusers only."""
        return bool(request.user.is_superuser) and super().has_add_permission(request, *args)  # type: ignore[misc]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Superusers only."""
        return bool(request.user.is_superuser) and super().has_change_permission(request, obj)  # type: ignore[misc]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Superusers only."""
        return bool(request.user.is_superuser) and super().has_delete_permission(request, obj)  # type: ignore[misc]


def _operator_only_dot_admins(site: admin.AdminSite) -> None:
    for model, model_admin in list(site._registry.items()):
        if model._meta.app_label != "oauth2_provider" or isinstance(model_admin, OperatorOnly):
            continue
        site.unregister(model)
        site.register(model, type(f"OperatorOnly{type(model_admin).__name__}", (OperatorOnly, type(model_admin)), {}))


_operator_only_dot_admins(admin.site)
