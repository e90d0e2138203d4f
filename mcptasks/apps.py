from django.apps import AppConfig


class McpTasksConfig(AppConfig):
    """The MCP server: sessions, tasks, streams and the tool registry."""

    name = "mcptasks"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "MCP tasks"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import checks  # noqa: F401  (registers system checks)

        # Tools, resources and prompts live in each installed app's tools.py, like admin.py.
        autodiscover_modules("tools")
