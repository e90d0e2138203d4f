from django.apps import AppConfig


class ConformanceConfig(AppConfig):
    """Fixtures of the official MCP conformance suite (MCPTASKS_CONFORMANCE_FIXTURES=1)."""

    name = "mcptasks.conformance"
    label = "mcptasks_conformance"
    verbose_name = "MCP conformance fixtures"
