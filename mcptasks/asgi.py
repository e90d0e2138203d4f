"""ASGI entry point: the MCP endpoint goes to the Channels consumer, the rest to Django.

``daphne mcptasks.asgi:application`` serves it; any number of such processes may share one
PostgreSQL and one Redis.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mcptasks.settings")

from django.conf import settings
from django.core.asgi import get_asgi_application

django_asgi = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from mcptasks import hardening, observability  # noqa: E402
from mcptasks.endpoint.consumer import McpConsumer  # noqa: E402
from mcptasks.processes import gc_tuning  # noqa: E402
from mcptasks.processes.embedded import EmbeddedRuntime  # noqa: E402
from tenants import conf as tenant_conf  # noqa: E402
from tenants.infra import redis_url  # noqa: E402

hardening.require_production_secret_key("web process")
redis_url.require_supported(str(getattr(settings, "REDIS_URL", "") or ""), "web process")
hardening.install_access_log_redaction()
hardening.install_body_limit()

_mcp_path = tenant_conf.get().MCP_PATH.strip("/")
# The MCP endpoint's server span (continuing a client's `traceparent` header) when tracing is on;
# the rest of Django gets the Django instrumentation's.
_mcp = observability.wrap_asgi(McpConsumer.as_asgi())

router = ProtocolTypeRouter(
    {
        "http": URLRouter(
            [
                re_path(rf"^{_mcp_path}/?$", _mcp),
                # A tenant's own endpoint: tokens from the tenant's identity providers name it
                # as their audience by default (see docs/tenants.md).
                re_path(rf"^{_mcp_path}/t/(?P<tenant>[-a-zA-Z0-9_]{{1,64}})/?$", _mcp),
                re_path(r"", django_asgi),  # type: ignore[arg-type]
            ]
        ),
    }
)

#: Starts the embedded worker and periodic cleanup on the first request when configured.
application = EmbeddedRuntime(router)

gc_tuning.tune()  # last: what start-up made is frozen
