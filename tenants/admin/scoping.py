"""The base of every tenant-scoped, audited admin of both apps.

Operators see the tenants :mod:`tenants.access` gives them and change only those they manage;
every add, change and delete is an audit event naming the operator, the object and each changed
field before and after (secrets are never written, only that they changed).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import oauth2_provider.admin  # noqa: F401  (DOT's admins registered first: wrapped below)
from django.contrib import admin
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

from tenants import access
from tenants.crypto import EncryptedTextField
from tenants.models import (
    Tenant,
)
from tenants.signals import emit

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
        managed = access.managed_tenant_ids(request.user)
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
    managed = access.managed_tenant_ids(request.user)
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
        return access.scope_queryset(super().get_queryset(request), access.visible_tenant_ids(request.user),
                                    field=self.tenant_field)

    def _tenant_of(self, obj: Any) -> int | None:
        # Also called for inline rows (a principal on a tenant's page): their own tenant.
        if isinstance(obj, Tenant):
            return int(obj.pk) if obj.pk is not None else None
        value = getattr(obj, "tenant_id", None)
        return int(value) if value is not None else None

    def _manages(self, request: HttpRequest, obj: Any) -> bool:
        managed = access.managed_tenant_ids(request.user)
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
