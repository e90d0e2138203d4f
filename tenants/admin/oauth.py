"""django-oauth-toolkit's own admins, wrapped so that only superusers open them."""

from __future__ import annotations

from typing import Any

import oauth2_provider.admin  # noqa: F401  (DOT's admins registered first: wrapped below)
from django.contrib import admin
from django.http import HttpRequest


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
