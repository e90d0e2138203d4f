"""Tenants and the principals (OAuth clients and users) that act inside them."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator
from django.db import models
from oauth2_provider.settings import oauth2_settings

from tenants.crypto import EncryptedTextField
from tenants.roles import Role

#: Scopes a new application or membership may use until an operator grants more.
LEAST_PRIVILEGE_SCOPES = "mcp:tools mcp:tasks"

# Hard bounds of every limit a tenant row (or a setting) can hold. Enforced by model
# validation, by database check constraints and, for values read back (a row stored before the
# constraints, a setting), by clamping in tenants.selectors.limits_of: a ttl must always fit a
# datetime, and a limit must never be a way to turn a quota off.
#: Longest task ttl (30 days), per tenant or global.
TTL_MS_LIMIT = 30 * 24 * 3600 * 1000
#: Longest suggested pollInterval (1 hour).
POLL_INTERVAL_MS_LIMIT = 3600 * 1000
#: Most concurrent tasks a quota may allow.
CONCURRENCY_LIMIT = 100_000
#: Most requests per minute a rate limit may allow.
RATE_PER_MIN_LIMIT = 1_000_000
#: Most clock skew an external issuer's tokens may be allowed (past it an expired token is not one).
LEEWAY_S_LIMIT = 300

#: Field -> upper bound: the limit columns of a tenant.
TENANT_LIMIT_BOUNDS: dict[str, int] = {
    "max_concurrent_tasks": CONCURRENCY_LIMIT,
    "max_concurrent_tasks_per_principal": CONCURRENCY_LIMIT,
    "default_ttl_ms": TTL_MS_LIMIT,
    "max_ttl_ms": TTL_MS_LIMIT,
    "poll_interval_ms": POLL_INTERVAL_MS_LIMIT,
    "rate_create_per_min": RATE_PER_MIN_LIMIT,
    "rate_read_per_min": RATE_PER_MIN_LIMIT,
    "rate_other_per_min": RATE_PER_MIN_LIMIT,
}


def _bounded(field: str) -> list[MaxValueValidator]:
    return [MaxValueValidator(TENANT_LIMIT_BOUNDS[field])]


class Tenant(models.Model):
    """A customer of the hosted service. Limits are edited at run time and apply without restart.

    A null limit means "use the global setting" (ttl, pollInterval) or "unlimited" (quotas, rates).
    """

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    active = models.BooleanField(default=True)
    max_concurrent_tasks = models.PositiveIntegerField(
        null=True, blank=True, validators=_bounded("max_concurrent_tasks")
    )
    max_concurrent_tasks_per_principal = models.PositiveIntegerField(
        null=True, blank=True, validators=_bounded("max_concurrent_tasks_per_principal")
    )
    default_ttl_ms = models.PositiveBigIntegerField(null=True, blank=True, validators=_bounded("default_ttl_ms"))
    max_ttl_ms = models.PositiveBigIntegerField(null=True, blank=True, validators=_bounded("max_ttl_ms"))
    poll_interval_ms = models.PositiveIntegerField(null=True, blank=True, validators=_bounded("poll_interval_ms"))
    rate_create_per_min = models.PositiveIntegerField(null=True, blank=True, validators=_bounded("rate_create_per_min"))
    rate_read_per_min = models.PositiveIntegerField(null=True, blank=True, validators=_bounded("rate_read_per_min"))
    rate_other_per_min = models.PositiveIntegerField(null=True, blank=True, validators=_bounded("rate_other_per_min"))
    # Non-terminal tasks right now; changed only by conditional UPDATEs (see tenants.quotas).
    active_tasks = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        permissions = [("audit_all_tenants", "Can audit every tenant (read-only)")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(**{f"{name}__isnull": True}) | models.Q(**{f"{name}__lte": bound}),
                name=f"tenant_{name}_bounded",
            )
            for name, bound in TENANT_LIMIT_BOUNDS.items()
        ]

    def __str__(self) -> str:
        return self.slug

class Principal(models.Model):
    """An identity inside a tenant: an OAuth client (``client_id``), a user (``sub``) or anonymous."""

    class Kind(models.TextChoices):
        CLIENT = "client", "OAuth client"
        USER = "user", "User"
        ANONYMOUS = "anonymous", "Anonymous"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="principals")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    # The external issuer (``iss``) that vouches for this identity; blank for local identities
    # (built-in AS clients and users, anonymous). Part of the key: the same ``sub`` from two
    # issuers, or equal to a local username, is never the same principal.
    issuer = models.CharField(max_length=500, blank=True, default="")
    # client_id for clients, sub for users, "anonymous" for the anonymous principal.
    identifier = models.CharField(max_length=255)
    name = models.CharField(max_length=200, blank=True)
    active_tasks = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "kind", "issuer", "identifier"], name="uniq_principal_per_tenant_issuer"
            ),
        ]
        ordering = ["tenant", "identifier"]

    def __str__(self) -> str:
        # Operators read names; the raw identifier (a client_id, a sub) only when there is none.
        if self.name:
            return f"{self.name} ({self.tenant.slug})"
        where = f"{self.issuer}#" if self.issuer else ""
        return f"{self.tenant.slug}:{self.kind}:{where}{self.identifier}"


class TenantApplication(models.Model):
    """Ties one django-oauth-toolkit Application (a client of the built-in AS) to a tenant.

    Tokens minted for an application without this row are refused by :func:`tenants.auth.authenticate`.
    ``principal`` is the client principal acting for client-credentials tokens; tokens from the
    authorization-code flow act as the user principal of the resource owner instead.
    """

    application = models.OneToOneField(
        oauth2_settings.APPLICATION_MODEL, on_delete=models.CASCADE, related_name="tenant_link"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="applications")
    principal = models.ForeignKey(
        Principal, on_delete=models.SET_NULL, null=True, blank=True, related_name="applications"
    )
    # Granted by an operator, never by the client asking: the most a token of this application
    # may carry (space-separated). A request for more gets ``invalid_scope``.
    allowed_scopes = models.CharField(max_length=200, default=LEAST_PRIVILEGE_SCOPES)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "tenant OAuth application"

    def __str__(self) -> str:
        return f"{self.tenant.slug}:{self.application_id}"

    def clean(self) -> None:
        """The acting principal must be one of the application's own tenant's principals."""
        from django.core.exceptions import ValidationError

        if self.principal_id is not None and self.tenant_id is not None and (
            not Principal.objects.filter(pk=self.principal_id, tenant_id=self.tenant_id).exists()
        ):
            # Worded like a missing row: another tenant's principal is never confirmed.
            raise ValidationError({"principal": "Select a principal of this application's tenant."})

    def scope_set(self) -> frozenset[str]:
        """The allowed scopes as a set."""
        return frozenset(self.allowed_scopes.split())


class TenantMembership(models.Model):
    """A Django user's membership of a tenant: only members get tokens for its applications.

    A user token carries at most the scopes of both its application and this membership.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tenant_memberships")
    allowed_scopes = models.CharField(max_length=200, default=LEAST_PRIVILEGE_SCOPES)
    # Operator access to this tenant (admin, dashboard, audit API); see tenants/roles.py.
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "user"], name="uniq_membership")]
        ordering = ["tenant", "user"]

    def __str__(self) -> str:
        return f"{self.tenant.slug}:{self.user}"

    def scope_set(self) -> frozenset[str]:
        """The allowed scopes as a set."""
        return frozenset(self.allowed_scopes.split())


class ExternalIssuer(models.Model):
    """An external authorization server (Auth0, Keycloak, Entra, ...) whose JWTs a tenant accepts."""

    class PrincipalClaim(models.TextChoices):
        SUB = "sub", "sub (user)"
        CLIENT_ID = "client_id", "client_id (client)"
        AZP = "azp", "azp (client)"

    class ScopesClaim(models.TextChoices):
        SCOPE = "scope", "scope (space-separated string)"
        SCP = "scp", "scp (list or string)"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="external_issuers")
    name = models.CharField(max_length=200, blank=True)
    active = models.BooleanField(default=True)
    # Must equal the token's ``iss`` exactly.
    issuer = models.CharField(max_length=500, db_index=True)
    jwks_url = models.URLField(max_length=500, blank=True)
    # A JWKS document ({"keys": [...]}) used instead of (or before) jwks_url.
    static_keys = models.JSONField(null=True, blank=True)
    # Only for HS* algorithms, which are refused unless this is set explicitly. Stored
    # encrypted (tenants.crypto) and never displayed after saving.
    shared_secret = EncryptedTextField(blank=True, default="")
    # Expected ``aud``; blank means the tenant's own endpoint (``<canonical MCP URI>/t/<slug>``),
    # so tokens for one tenant never name another's resource (RFC 8707).
    audience = models.CharField(max_length=500, blank=True)
    # Claim naming the tenant (blank: not checked) and its expected value (blank: the tenant slug).
    tenant_claim = models.CharField(max_length=100, blank=True)
    tenant_claim_value = models.CharField(max_length=200, blank=True)
    principal_claim = models.CharField(
        max_length=16, choices=PrincipalClaim.choices, default=PrincipalClaim.SUB
    )
    scopes_claim = models.CharField(max_length=16, choices=ScopesClaim.choices, default=ScopesClaim.SCOPE)
    # Space-separated allowed JWS algorithms; "none" is never accepted.
    algorithms = models.CharField(max_length=200, default="RS256 ES256")
    leeway_s = models.PositiveIntegerField(default=30, validators=[MaxValueValidator(LEEWAY_S_LIMIT)])
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "issuer"]
        constraints = [
            models.CheckConstraint(condition=models.Q(leeway_s__lte=LEEWAY_S_LIMIT), name="issuer_leeway_s_bounded"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}:{self.issuer}"

    def allowed_algorithms(self) -> list[str]:
        """The algorithms this issuer may use: never ``none``; HS* only with a shared secret."""
        algs = []
        for alg in self.algorithms.split():
            if alg.lower() == "none":
                continue
            if alg.upper().startswith("HS") and not self.shared_secret:
                continue
            algs.append(alg)
        return algs

    def clean(self) -> None:
        """Refuse configurations that could never verify a token safely."""
        from django.core.exceptions import ValidationError

        if any(a.lower() == "none" for a in self.algorithms.split()):
            raise ValidationError({"algorithms": "'none' is never allowed."})
        if any(a.upper().startswith("HS") for a in self.algorithms.split()) and not self.shared_secret:
            raise ValidationError({"algorithms": "HS* algorithms need an explicit shared secret."})
        if not (self.jwks_url or self.static_keys or self.shared_secret):
            raise ValidationError("Set a JWKS URL, static keys or a shared secret.")
        from tenants.outbound import literal_host_refused

        if self.jwks_url and literal_host_refused(self.jwks_url):
            # Checked again on the resolved address at every fetch (tenants.outbound).
            raise ValidationError({"jwks_url": "This address is not allowed (loopback, private, link-local or "
                                               "metadata); see MCPTASKS_OUTBOUND_ALLOWED_NETWORKS."})
        others = ExternalIssuer.objects.filter(issuer=self.issuer).exclude(tenant_id=self.tenant_id)
        if self.pk:
            others = others.exclude(pk=self.pk)
        if others.exists() and (not self.tenant_claim or others.filter(tenant_claim="").exists()):
            raise ValidationError(
                {"tenant_claim": "This issuer is trusted by another tenant too: every tenant trusting it must "
                                 "name the claim (and value) that selects the tenant."}
            )
        if self.tenant_id is not None and any(self.overlaps(o) for o in others.select_related("tenant")):
            # Never says which tenant: another tenant's row is not this operator's business.
            raise ValidationError(
                "Another tenant trusts this issuer with the same audience and an overlapping tenant claim: "
                "a token could verify for both tenants. Use this tenant's own endpoint as audience or a "
                "tenant claim value of its own."
            )

    # --- which tokens a row can verify (two tenants' rows must never share one) ----------------

    def audience_key(self) -> tuple[str, str]:
        """The audience this row accepts: ``("tenant", slug)`` for a tenant endpoint, else the URI.

        Blank means the tenant's own endpoint; an explicit URI naming a tenant endpoint
        (``…/t/<slug>``) is that tenant's endpoint whatever its host (hosts vary by request).
        """
        from tenants.conf import normalize_uri, resource_tenant

        if not self.audience:
            return ("tenant", self.tenant.slug)
        slug = resource_tenant(self.audience)
        return ("tenant", slug) if slug else ("uri", normalize_uri(self.audience) or self.audience)

    def claim_key(self) -> tuple[str, str] | None:
        """``(claim, expected value)`` that selects the tenant, or None when no claim is checked."""
        if not self.tenant_claim:
            return None
        return (self.tenant_claim, self.tenant_claim_value or self.tenant.slug)

    def overlaps(self, other: ExternalIssuer) -> bool:
        """Whether one token of this issuer could verify with both rows.

        Same issuer, same audience, and tenant claims that do not exclude each other: a row
        without a claim accepts any value, and two different claim names can both be in one token.
        """
        if self.issuer != other.issuer or self.audience_key() != other.audience_key():
            return False
        mine, theirs = self.claim_key(), other.claim_key()
        return mine is None or theirs is None or mine[0] != theirs[0] or mine == theirs


#: The events a webhook endpoint may subscribe to (``task.<status>`` of the 2026-07-28 wire form).
WEBHOOK_EVENTS = ("task.input_required", "task.completed", "task.failed", "task.cancelled", "task.working")
#: What a new endpoint receives when no events are named.
DEFAULT_WEBHOOK_EVENTS = ["task.input_required", "task.completed", "task.failed", "task.cancelled"]


def new_webhook_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` and 32 random bytes in base64."""
    import base64
    import secrets

    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def default_webhook_events() -> list[str]:
    """A fresh copy of :data:`DEFAULT_WEBHOOK_EVENTS` (a mutable default)."""
    return list(DEFAULT_WEBHOOK_EVENTS)


class WebhookEndpoint(models.Model):
    """A URL that receives signed task events of a tenant, or of one of its principals.

    The signing secret is stored encrypted (:mod:`tenants.crypto`), shown once when created
    or rotated; after a rotation the previous secret keeps signing too (a second signature)
    until ``previous_secret_expires_at``.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="webhook_endpoints")
    # Null: every task of the tenant (the application's endpoint); else only this principal's.
    principal = models.ForeignKey(
        Principal, on_delete=models.CASCADE, null=True, blank=True, related_name="webhook_endpoints"
    )
    url = models.URLField(max_length=500)
    events = models.JSONField(default=default_webhook_events)
    enabled = models.BooleanField(default=True)
    secret = EncryptedTextField(default=new_webhook_secret, editable=False)
    previous_secret = EncryptedTextField(blank=True, default="", editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Last successful delivery, and when the current run of failures began (null: none).
    last_success_at = models.DateTimeField(null=True, blank=True, editable=False)
    failing_since = models.DateTimeField(null=True, blank=True, editable=False)
    disabled_reason = models.CharField(max_length=200, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "enabled"], name="webhook_tenant_enabled_idx")]

    def __str__(self) -> str:
        return f"{self.tenant.slug}:{self.url[:80]}"

    def clean(self) -> None:
        """Known events only; the principal belongs to the tenant; an allowed destination."""
        from django.core.exceptions import ValidationError

        from tenants.outbound import literal_host_refused

        if not isinstance(self.events, list) or not self.events or any(e not in WEBHOOK_EVENTS for e in self.events):
            raise ValidationError({"events": f"A non-empty list of: {', '.join(WEBHOOK_EVENTS)}."})
        if (self.principal_id is not None and self.tenant_id is not None
                and not Principal.objects.filter(pk=self.principal_id, tenant_id=self.tenant_id).exists()):
            raise ValidationError({"principal": "Not a principal of this tenant."})
        if not self.url.lower().startswith(("https://", "http://")):
            raise ValidationError({"url": "An http(s) URL."})
        if literal_host_refused(self.url):
            raise ValidationError({"url": "This address is not allowed (loopback, private, link-local or "
                                          "metadata); see MCPTASKS_OUTBOUND_ALLOWED_NETWORKS."})

    def signing_secrets(self, *, now: Any) -> list[str]:
        """The secrets that sign a delivery now: the current one, and the previous during its overlap."""
        out = [self.secret]
        if self.previous_secret and self.previous_secret_expires_at and self.previous_secret_expires_at > now:
            out.append(self.previous_secret)
        return out
