"""Who may read the audit-review API (:mod:`mcptasks.console.api`), and how OpenAPI describes it.

Kept apart from :mod:`mcptasks.console.api_auth`, which DRF imports while loading its settings:
the OpenAPI extensions below import drf-spectacular, which must not run at that point.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.authentication import BasicScheme
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from mcptasks.console import api_auth
from tenants import access
from tenants.conf import AUDIT_READ_SCOPE


class ThrottledBasicScheme(BasicScheme):
    """OpenAPI: the throttled HTTP Basic authentication is plain HTTP Basic to clients."""

    target_class = "mcptasks.console.api_auth.ThrottledBasicAuthentication"
    priority = 0


class AuditTokenScheme(OpenApiAuthenticationExtension):
    """OpenAPI: OAuth 2.0 bearer tokens of the built-in authorization server with ``audit:read``."""

    target_class = "mcptasks.console.api_auth.AuditTokenAuthentication"
    name = "oauth2"
    priority = 0

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        """Client credentials (an auditor's application) and authorization code + PKCE flows."""
        scopes = {AUDIT_READ_SCOPE: "Read the tenant's audit events and tasks"}
        return {
            "type": "oauth2",
            "description": "An access token from this server's authorization server (/o/token/) with the "
                           "audit:read scope, for an application of the tenant whose operator (the "
                           "resource owner, or the application's owner for client credentials) is its "
                           "auditor or tenant admin.",
            "flows": {
                "clientCredentials": {"tokenUrl": "/o/token/", "scopes": scopes},
                "authorizationCode": {"authorizationUrl": "/o/authorize/", "tokenUrl": "/o/token/",
                                      "scopes": scopes},
            },
        }

    def get_security_requirement(self, auto_schema: Any) -> dict[str, list[str]]:
        """Every operation needs ``audit:read``."""
        return {self.name: [AUDIT_READ_SCOPE]}


class TokenScope(BasePermission):
    """An OAuth token must carry ``audit:read`` (granted now); sessions and Basic pass through."""

    message = f"The access token lacks the {AUDIT_READ_SCOPE} scope."

    def has_permission(self, request: Request, view: Any) -> bool:
        """False (403) for a token without the scope."""
        return not api_auth.is_token(request.auth) or api_auth.token_has_audit_scope(request.auth)


def visible_tenants(request: Request) -> frozenset[int] | None:
    """Tenants the caller reads here: the operator's, and for a token only its application's."""
    visible = access.visible_tenant_ids(request.user)
    if not api_auth.is_token(request.auth):
        return visible
    own = api_auth.token_tenant_id(request.auth)
    return frozenset({own}) if visible is None or own in visible else frozenset()


class IsOperator(BasePermission):
    """Signed in, and an operator of at least one tenant (auditor, tenant admin, or every tenant)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        """Whether the caller may read the API's schema and docs."""
        user = request.user
        return bool(user and user.is_authenticated and visible_tenants(request) != frozenset())
