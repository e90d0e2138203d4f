from django.apps import AppConfig


class TestingConfig(AppConfig):
    """Tools for the test-suite and fault benchmarks (MCPTASKS_EXTRA_APPS=mcptasks.testing)."""

    name = "mcptasks.testing"
    label = "mcptasks_testing"
    verbose_name = "mcptasks test tools"
