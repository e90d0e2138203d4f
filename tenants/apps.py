from django.apps import AppConfig


class TenantsConfig(AppConfig):
    """Tenants and OAuth."""

    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Tenants"

    def ready(self) -> None:
        from . import auth_cache, checks  # noqa: F401  (checks registers system checks)

        auth_cache.connect_invalidation()
