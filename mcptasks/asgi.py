"""ASGI entry point: the MCP endpoint goes to the Channels consumer, the rest to Django.

``daphne mcptasks.asgi:application`` serves it; any number of such processes may share one
PostgreSQL and one Redis.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mcptasks.settings")

from django.core.asgi import get_asgi_application

django_asgi = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from mcptasks import hardening  # noqa: E402
from mcptasks.runtime import EmbeddedRuntime  # noqa: E402
from mcptasks.transport.consumer import McpConsumer  # noqa: E402
from tenants import conf as tenant_conf  # noqa: E402

hardening.require_production_secret_key("web process")
hardening.install_access_log_redaction()
hardening.install_body_limit()

_mcp_path = tenant_conf.get().MCP_PATH.strip("/")

router = ProtocolTypeRouter(
    {
        "http": URLRouter(
            [
                re_path(rf"^{_mcp_path}/?$", McpConsumer.as_asgi()),
                # A tenant's own endpoint: tokens from the tenant's identity providers name it
                # as their audience by default (see docs/tenants.md).
                re_path(rf"^{_mcp_path}/t/(?P<tenant>[-a-zA-Z0-9_]{{1,64}})/?$", McpConsumer.as_asgi()),
                re_path(r"", django_asgi),  # type: ignore[arg-type]
            ]
        ),
    }
)

#: Starts the embedded worker and periodic cleanup on the first request when configured.
application = EmbeddedRuntime(router)
