"""Who is calling: the auth context every service and selector is given."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class AuthContext:
    """Who is calling: the tenant and principal every task is bound to."""

    tenant_id: int
    tenant_slug: str
    principal_id: int
    principal_name: str
    scopes: frozenset[str] = field(default_factory=frozenset)
    anonymous: bool = False
    # Identifies the credential (token row id or JWT jti) for audit logs; never the token itself.
    credential_ref: str = ""
    # When the credential stops being valid (epoch seconds; None: no expiry of its own). Bounds
    # how long a verified token may be reused from the per-process cache.
    expires_at: float | None = field(default=None, compare=False)

    def has_scope(self, scope: str) -> bool:
        """Whether the token carries ``scope`` (anonymous callers have every MCP scope)."""
        return self.anonymous or scope in self.scopes
