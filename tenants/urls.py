"""Well-known discovery documents and the built-in authorization server (``/o/``).

Mount at the site root: ``path("", include("tenants.urls"))``.
"""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, include, path
from oauth2_provider import urls as dot_urls

from tenants import conf, views
from tenants.oauth import TenantAuthorizationView

# DOT's protocol endpoints (authorize, token, revoke, introspect, device flow) without its
# user-facing application management pages and dynamic client registration: every
# application must be created bound to a tenant (admin or ``mcptasks_tenant app``).
_oauth_patterns: list[URLPattern | URLResolver] = [
    path("token/", views.ResourceTokenView.as_view(), name="token"),
    path("authorize/", TenantAuthorizationView.as_view(), name="authorize"),
    *(p for p in dot_urls.base_urlpatterns if getattr(p, "name", None) not in ("token", "authorize")),
]

urlpatterns: list[URLPattern | URLResolver] = [
    path(
        ".well-known/oauth-protected-resource",
        views.protected_resource_metadata,
        name="oauth-protected-resource",
    ),
    path(
        ".well-known/oauth-protected-resource/<path:resource_path>",
        views.protected_resource_metadata,
        name="oauth-protected-resource-path",
    ),
    path(
        ".well-known/oauth-authorization-server",
        views.AuthorizationServerMetadataView.as_view(),
        name="oauth-authorization-server",
    ),
]

if conf.get().BUILTIN_AS:
    urlpatterns.append(path("o/", include((_oauth_patterns, "oauth2_provider"), namespace="oauth2_provider")))
