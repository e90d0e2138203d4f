"""``manage.py mcptasks_tenant``: create tenants, mint tokens, register OAuth applications."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants import cli


class Command(BaseCommand):
    help = "Manage tenants: create SLUG | token SLUG | list | app SLUG | webhook ... | recount [SLUG]."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        p = sub.add_parser("create", help="create a tenant")
        p.add_argument("slug")
        p.add_argument("--name", default="")
        p = sub.add_parser("token", help="print a bearer token (last line of output)")
        p.add_argument("slug")
        p.add_argument("--principal", default="cli")
        p.add_argument("--scopes", nargs="+", default=None, help="default: mcp:tools mcp:tasks")
        p.add_argument("--expires-s", type=int, default=None, dest="expires_s")
        p.add_argument(
            "--resource", default=None, help="bind to this MCP URL (default: MCPTASKS_PUBLIC_URL + MCP path)"
        )
        sub.add_parser("list", help="list tenants")
        p = sub.add_parser("app", help="register an OAuth application of a tenant")
        p.add_argument("slug")
        p.add_argument("--name", default="client")
        p.add_argument(
            "--grant", choices=["client-credentials", "authorization-code"], default="client-credentials"
        )
        p.add_argument("--redirect-uri", action="append", dest="redirect_uris", default=None)
        p.add_argument("--scopes", nargs="+", default=None, help="scopes granted (default: mcp:tools mcp:tasks)")
        p.add_argument("--owner", default=None,
                       help="client-credentials: the operator (username) its audit:read tokens act for")
        p = sub.add_parser("member", help="make a user a member of a tenant (authorization-code tokens)")
        p.add_argument("slug")
        p.add_argument("username")
        p.add_argument("--scopes", nargs="+", default=None, help="scopes allowed (default: mcp:tools mcp:tasks)")
        p = sub.add_parser("operator", help="make a user an auditor or a tenant admin (admin, dashboard, API)")
        p.add_argument("username")
        p.add_argument("--role", choices=["auditor", "admin"], required=True)
        group = p.add_mutually_exclusive_group(required=True)
        group.add_argument("--tenant", dest="slug", help="the tenant the role applies to")
        group.add_argument("--all-tenants", action="store_true", help="auditors only: every tenant, read-only")
        p = sub.add_parser("webhook", help="webhook endpoints: add SLUG URL | rotate ID | list SLUG")
        hooks = p.add_subparsers(dest="webhook_action", required=True)
        h = hooks.add_parser("add", help="register an endpoint; prints its signing secret (last line)")
        h.add_argument("slug")
        h.add_argument("url")
        h.add_argument("--principal", default=None, help="only this principal's tasks (default: the tenant's)")
        h.add_argument("--events", nargs="+", default=None,
                       help="default: task.input_required task.completed task.failed task.cancelled")
        h = hooks.add_parser("rotate", help="new signing secret (last line); the old one signs during the overlap")
        h.add_argument("endpoint_id", type=int)
        h = hooks.add_parser("list", help="list a tenant's endpoints")
        h.add_argument("slug")
        p = sub.add_parser("recount", help="repair the concurrency counters from the task table")
        p.add_argument("slug", nargs="?", default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            if action == "create":
                lines = cli.create(slug=options["slug"], name=options["name"])
            elif action == "token":
                lines = cli.token(
                    slug=options["slug"],
                    principal=options["principal"],
                    scopes=options["scopes"],
                    expires_s=options["expires_s"],
                    resource=options["resource"],
                )
            elif action == "list":
                lines = cli.list_tenants()
            elif action == "recount":
                lines = cli.recount(slug=options["slug"])
            elif action == "operator":
                lines = cli.operator(username=options["username"], role=options["role"], slug=options.get("slug"))
            elif action == "webhook":
                lines = self._webhook(options)
            elif action == "member":
                lines = cli.member(slug=options["slug"], username=options["username"], scopes=options["scopes"])
            else:
                lines = cli.app(
                    slug=options["slug"],
                    name=options["name"],
                    grant=options["grant"],
                    redirect_uris=options["redirect_uris"],
                    scopes=options["scopes"],
                    owner=options["owner"],
                )
        except cli.CliError as exc:
            raise CommandError(str(exc)) from None
        for line in lines:
            self.stdout.write(line)

    def _webhook(self, options: dict[str, Any]) -> list[str]:
        what = options["webhook_action"]
        if what == "add":
            return cli.webhook_add(slug=options["slug"], url=options["url"], principal=options["principal"],
                                   events=options["events"])
        if what == "rotate":
            return cli.webhook_rotate(endpoint_id=options["endpoint_id"])
        return cli.webhook_list(slug=options["slug"])
