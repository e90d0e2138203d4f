"""Tenants and the principals (OAuth clients and users) that act inside them."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from oauth2_provider.settings import oauth2_settings

from .crypto import EncryptedTextField
from .roles import Role

#: Scopes a new application or membership may use until an operator grants more.
LEAST_PRIVILEGE_SCOPES = "mcp:tools mcp:tasks"


class Tenant(models.Model):
    """A customer of the hosted service. Limits are edited at run time and apply without restart.

    A null limit means "use the global setting" (ttl, pollInterval) or "unlimited" (quotas, rates).
    """

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    active = models.BooleanField(default=True)
    max_concurrent_tasks = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent_tasks_per_principal = models.PositiveIntegerField(null=True, blank=True)
    default_ttl_ms = models.PositiveBigIntegerField(null=True, blank=True)
    max_ttl_ms = models.PositiveBigIntegerField(null=True, blank=True)
    poll_interval_ms = models.PositiveIntegerField(null=True, blank=True)
    rate_create_per_min = models.PositiveIntegerField(null=True, blank=True)
    rate_read_per_min = models.PositiveIntegerField(null=True, blank=True)
    rate_other_per_min = models.PositiveIntegerField(null=True, blank=True)
    # Non-terminal tasks right now; changed only by conditional UPDATEs (see tenants.quotas).
    active_tasks = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        permissions = [("audit_all_tenants", "Can audit every tenant (read-only)")]

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
    leeway_s = models.PositiveIntegerField(default=30)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "issuer"]

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
        others = ExternalIssuer.objects.filter(issuer=self.issuer).exclude(tenant_id=self.tenant_id)
        if self.pk:
            others = others.exclude(pk=self.pk)
        if others.exists() and (not self.tenant_claim or others.filter(tenant_claim="").exists()):
            raise ValidationError(
                {"tenant_claim": "This issuer is trusted by another tenant too: every tenant trusting it must "
                                 "name the claim (and value) that selects the tenant."}
            )
