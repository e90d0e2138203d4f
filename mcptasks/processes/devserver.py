"""The one-process development server behind ``manage.py serve``."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from django.conf import settings

from mcptasks import conf
from tenants import conf as tenant_conf

INIT_BODY = (
    '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    '"capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}'
)


#: The dev token's scopes and lifetime (a new one is minted when less than a day is left).
DEV_SCOPES = ("mcp:tools", "mcp:tasks")
DEV_TOKEN_LIFETIME_S = 30 * 24 * 3600


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
        """A bearer token of the demo tenant: the one of the last start while it is still valid
        here (same URL, not revoked, at least a day left), else a new one.

        Kept in ``VAR_DIR/dev-token.json`` (mode 0600) beside the embedded database, like the
        operator's password, so restarts do not pile up valid tokens nor break a client's config.
        """
        if self._token is None:
            from tenants import services as tenant_services

            tenant = tenant_services.get_or_create_tenant(slug="demo", name="Demo tenant")
            path = Path(settings.VAR_DIR) / "dev-token.json"
            stored = self._stored_token(path)
            if stored is not None:
                self._token = stored
                return stored
            self._token = tenant_services.issue_token(
                tenant=tenant, principal_name="dev", scopes=list(DEV_SCOPES), expires_s=DEV_TOKEN_LIFETIME_S,
                resource=self.url,
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)
            path.write_text(json.dumps({"url": self.url, "token": self._token}))
        return self._token

    def _stored_token(self, path: Path) -> str | None:
        """The stored token if it still authenticates at this URL with the dev scopes for a day."""
        import time

        from tenants.auth import AuthError, authenticate

        try:
            stored = json.loads(path.read_text())
            token, url = str(stored["token"]), str(stored["url"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if url != self.url:
            return None  # bound to another host or port
        try:
            ctx = authenticate(headers={"authorization": f"Bearer {token}"}, query_string="", resource_url=self.url)
        except AuthError:
            return None  # revoked, expired, tenant disabled...
        if ctx.anonymous or ctx.tenant_slug != "demo" or not set(DEV_SCOPES) <= ctx.scopes:
            return None
        if ctx.expires_at is None or ctx.expires_at < time.time() + 24 * 3600:
            return None
        return token

    def operator_login(self) -> tuple[str, str | None]:
        """(username, password) of the development operator, created on first start.

        The password is kept in ``VAR_DIR/dev-operator.json`` (mode 0600, beside the embedded
        database) so every start can print it; None once somebody changed it.
        """
        from django.contrib.auth import get_user_model

        user_model = get_user_model()
        path = Path(settings.VAR_DIR) / "dev-operator.json"
        stored = json.loads(path.read_text()) if path.exists() else None
        if stored is None:
            username, password = "operator", secrets.token_urlsafe(12)
            user = user_model.objects.filter(username=username).first()
            if user is None:
                user_model.objects.create_superuser(username=username, password=password, email="")
            else:
                user.set_password(password)
                user.save(update_fields=["password"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)
            path.write_text(json.dumps({"username": username, "password": password}))
            stored = {"username": username, "password": password}
        user = user_model.objects.filter(username=stored["username"]).first()
        valid = user is not None and user.check_password(stored["password"])
        return stored["username"], stored["password"] if valid else None

    def banner(self) -> list[str]:
        """What ``serve`` prints before serving."""
        token = self.dev_token()
        username, password = self.operator_login()
        base = self.url.removesuffix(tenant_conf.get().MCP_PATH)
        login = f"user {username!r}, password {password!r}" if password else (
            f"user {username!r} (password changed; reset it with: manage.py changepassword {username})")
        return [
            f"mcptasks is serving the MCP endpoint at {self.url}",
            "Embedded worker: " + ("on" if conf.get().EMBEDDED_WORKER else "off"),
            "Try it:",
            f"  curl -s {self.url} -H 'Authorization: Bearer {token}' "
            "-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' "
            "-d '" + INIT_BODY + "'",
            f"MCP URL: {self.url}",
            f"Dev token (Authorization: Bearer ...): {token}",
            f"Operator console: {base}/admin/ ({login}); dashboard: {base}/admin/dashboard/",
        ]

    def run(self) -> None:
        """Serve until interrupted."""
        from daphne.cli import CommandLineInterface

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mcptasks.settings")
        CommandLineInterface().run(["-b", self.host, "-p", str(self.port), "mcptasks.asgi:application"])
