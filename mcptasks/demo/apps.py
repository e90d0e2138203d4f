from django.apps import AppConfig


class DemoConfig(AppConfig):
    """Demo tools (MCPTASKS_DEMO_TOOLS=1, the default)."""

    name = "mcptasks.demo"
    label = "mcptasks_demo"
    verbose_name = "mcptasks demo tools"
