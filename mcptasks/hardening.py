"""Process-level safety rails: a real SECRET_KEY outside development, no tokens in access logs."""

from __future__ import annotations

import sys
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

DEV_SECRET_PREFIX = "dev-insecure-"
_dev_server = False


def allow_dev_secret_key() -> None:
    """``manage.py serve`` (the local development server) may run with the development key."""
    global _dev_server
    _dev_server = True


def require_production_secret_key(role: str) -> None:
    """Refuse to start a serving process (web, worker) with the public development key.

    Allowed only under ``manage.py serve``, in tests, or with ``DEBUG`` on: the key signs
    task-list cursors and admin sessions, and the development one is published in the source.
    """
    if settings.DEBUG or _dev_server or "pytest" in sys.modules:
        return
    key = str(settings.SECRET_KEY)
    if key.startswith(DEV_SECRET_PREFIX) or len(key) < 32:
        raise ImproperlyConfigured(
            f"The {role} refuses to start without a real SECRET_KEY (at least 32 characters, not the "
            "development default). Set SECRET_KEY in the environment, or use `manage.py serve` for development."
        )


def redact_target(target: str) -> str:
    """A request target safe to log: the path, with any query string replaced."""
    path, sep, _query = target.partition("?")
    return f"{path}?<redacted>" if sep else path


def install_access_log_redaction() -> None:
    """Make daphne's access log print paths without query strings (tokens never reach it).

    Daphne's NCSA access log (on by default) prints the full request target; a client that
    puts ``?access_token=...`` in the URL is refused, but the token would already be logged.
    """
    try:
        from daphne.access import AccessLogGenerator
    except ImportError:  # another ASGI server
        return
    if getattr(AccessLogGenerator, "_mcptasks_redacted", False):
        return
    original = AccessLogGenerator.write_entry

    def write_entry(self: Any, host: Any, date: Any, request: str, *args: Any, **kwargs: Any) -> Any:
        method, _, target = str(request).partition(" ")
        return original(self, host, date, f"{method} {redact_target(target)}", *args, **kwargs)

    AccessLogGenerator.write_entry = write_entry  # type: ignore[method-assign]
    AccessLogGenerator._mcptasks_redacted = True  # type: ignore[attr-defined]
