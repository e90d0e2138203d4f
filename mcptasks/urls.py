"""HTTP routes served by Django (everything except the MCP endpoint)."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from tenants.oauth import ThrottledLoginView

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics_view, name="metrics"),
    # Sign-in for the authorization-code flow of interactive MCP clients (users need no admin access).
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("tenants.urls")),
]
