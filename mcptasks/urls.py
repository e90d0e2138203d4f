"""HTTP routes served by Django (everything except the MCP endpoint)."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from mcptasks.console import api, views
from tenants.oauth import ThrottledLoginView, throttled_admin_login

# The admin's sign-in shares the failed-password budgets of every other sign-in.
admin.site.login = throttled_admin_login(admin.site.login)  # type: ignore[method-assign]

urlpatterns = [
    path("admin/dashboard/", admin.site.admin_view(views.dashboard_view), name="dashboard"),
    path("admin/", admin.site.urls),
    # The audit-review API, its OpenAPI schema and docs (assets served locally).
    path("api/", include(api.router.urls)),
    path("api/schema/", api.SchemaView.as_view(), name="api-schema"),
    path("api/docs/", api.DocsView.as_view(url_name="api-schema"), name="api-docs"),
    # The landing page (the admin's "View site") and the Markdown docs it links to.
    path("", views.landing, name="landing"),
    path("docs/", views.docs_index, name="docs-index"),
    path("docs/<str:name>", views.docs_page, name="docs-page"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", views.metrics_view, name="metrics"),
    # Sign-in for the authorization-code flow of interactive MCP clients (users need no admin access).
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("tenants.urls")),
]
