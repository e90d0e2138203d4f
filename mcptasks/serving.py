"""The one-process development server behind ``manage.py serve``."""

from __future__ import annotations

import os

from tenants import conf as tenant_conf

from . import conf

INIT_BODY = (
    '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    '"capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}'
)


class DevServer:
    """Daphne serving ``mcptasks.asgi:application`` with the embedded worker."""

    def __init__(self, *, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._token: str | None = None

    @property
    def url(self) -> str:
        """The MCP endpoint URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{tenant_conf.get().MCP_PATH}"

    def dev_token(self) -> str:
        """A bearer token of the demo tenant (created on first start)."""
        if self._token is None:
            from tenants import services as tenant_services

            tenant = tenant_services.get_or_create_tenant(slug="demo", name="Demo tenant")
            self._token = tenant_services.issue_token(
                tenant=tenant, principal_name="dev", scopes=["mcp:tools", "mcp:tasks"], expires_s=30 * 24 * 3600,
                resource=self.url,
            )
        return self._token

    def banner(self) -> list[str]:
        """What ``serve`` prints before serving."""
        token = self.dev_token()
        return [
            f"mcptasks is serving the MCP endpoint at {self.url}",
            "Embedded worker: " + ("on" if conf.get().EMBEDDED_WORKER else "off"),
            "Try it:",
            f"  curl -s {self.url} -H 'Authorization: Bearer {token}' "
            "-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' "
            "-d '" + INIT_BODY + "'",
            f"MCP URL: {self.url}",
            f"Dev token (Authorization: Bearer ...): {token}",
        ]

    def run(self) -> None:
        """Serve until interrupted."""
        from daphne.cli import CommandLineInterface

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mcptasks.settings")
        CommandLineInterface().run(["-b", self.host, "-p", str(self.port), "mcptasks.asgi:application"])
