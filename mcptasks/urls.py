"""HTTP routes served by Django (everything except the MCP endpoint)."""

from django.contrib import admin
from django.urls import include, path

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("", include("tenants.urls")),
]
