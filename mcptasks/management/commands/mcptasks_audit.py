"""``manage.py mcptasks_audit``: seal, verify, export anchors of and prune the audit chains."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from mcptasks.audit import trail as audit
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Audit chains: seal pending events, verify the chains, export anchors, prune old events."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("seal", help="Chain every committed unsealed event now.")
        verify = sub.add_parser("verify", help="Recompute the chains; exit 1 naming the first broken event.")
        verify.add_argument("--tenant", help="Only this tenant's chain (slug); default: every chain.")
        verify.add_argument("--anchors", help="A file of anchors exported earlier (JSON lines) to check against.")
        export = sub.add_parser("export-anchors", help="Print each chain's newest signed anchor (JSON lines).")
        export.add_argument("--tenant")
        prune = sub.add_parser("prune", help="Delete sealed events older than --older-than days (stays verifiable).")
        prune.add_argument("--older-than", type=float, required=True, metavar="DAYS")

    def _chain(self, slug: str | None) -> int | None:
        if slug is None:
            return None
        pk = Tenant.objects.filter(slug=slug).values_list("pk", flat=True).first()
        if pk is None:
            raise CommandError(f"no tenant {slug!r}")
        return int(pk)

    def handle(self, *args: Any, **opts: Any) -> None:
        action = opts["action"]
        if action == "seal":
            self.stdout.write(f"sealed {audit.seal_all()} events")
        elif action == "export-anchors":
            for anchor in audit.export_anchors(chain=self._chain(opts["tenant"])):
                self.stdout.write(json.dumps(anchor, sort_keys=True))
        elif action == "prune":
            if opts["older_than"] < 0:
                raise CommandError("--older-than must be >= 0")
            n = audit.prune(older_than=dt.timedelta(days=opts["older_than"]))
            self.stdout.write(f"pruned {n} events")
        else:
            self._verify(opts)

    def _verify(self, opts: dict[str, Any]) -> None:
        external: list[dict[str, Any]] = []
        if opts["anchors"]:
            try:
                with open(opts["anchors"], encoding="utf-8") as fh:
                    external = [json.loads(line) for line in fh if line.strip()]
                for anchor in external:
                    if not isinstance(anchor, dict) or not {"chain", "seq", "head", "kind", "at"} <= anchor.keys():
                        raise ValueError("each line must be an exported anchor (chain, seq, head, kind, at, signature)")
                    dt.datetime.fromisoformat(str(anchor["at"]))
                    int(anchor["chain"]), int(anchor["seq"])
            except (OSError, ValueError, TypeError) as exc:
                raise CommandError(f"cannot read anchors: {exc}") from None
        only = self._chain(opts["tenant"])
        names = dict(Tenant.objects.values_list("pk", "slug"))
        broken = 0
        for chain in [only] if only is not None else audit.chains():
            report = audit.verify(chain=chain, external_anchors=external)
            name = names.get(chain, "(no tenant)" if chain == 0 else f"deleted tenant {chain}")
            if report.ok:
                self.stdout.write(f"chain {chain} {name}: OK, {report.checked} events, head {report.head_seq}")
            else:
                broken += 1
                first = f"; first broken event {report.first_broken_id}" if report.first_broken_id else ""
                self.stdout.write(f"chain {chain} {name}: BROKEN{first}")
                for problem in report.problems:
                    self.stdout.write(f"  {problem}")
            if report.stale_unsealed:
                self.stdout.write(f"  warning: {report.stale_unsealed} events still unsealed (is a sealer running?)")
        if broken:
            raise CommandError(f"{broken} chain(s) broken")
