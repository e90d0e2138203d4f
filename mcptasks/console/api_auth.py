"""Authentication of the audit-review API (its own module: DRF imports it while loading its settings)."""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from rest_framework.authentication import BaseAuthentication, BasicAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, Throttled
from rest_framework.throttling import UserRateThrottle

from tenants import clientaddr, kv, oauth
from tenants.conf import AUDIT_READ_SCOPE

#: What a bearer token may look like (RFC 6750 b64token), checked before any lookup.
_B64TOKEN = re.compile(r"^[A-Za-z0-9\-._~+/]{1,512}=*$")


class ThrottledBasicAuthentication(BasicAuthentication):
    """HTTP Basic credentials with the failed-password budgets of the sign-in pages.

    Without them the API would be a way around the sign-in throttle for guessing passwords.
    """

    def authenticate_credentials(self, userid: str, password: str, request: Any = None) -> Any:
        """Refuse (429) while the username+address waits or the address is out of budget; count failures."""
        django_request = getattr(request, "_request", request)
        if oauth.sign_in_refused(django_request, userid):
            raise Throttled(wait=getattr(django_request, "sign_in_retry_after", None),
                            detail="Too many failed sign-ins. Wait a little and try again.")
        try:
            user = super().authenticate_credentials(userid, password, request)
        except AuthenticationFailed:
            oauth.sign_in_failed(django_request, userid)
            raise
        oauth.sign_in_succeeded(django_request, userid)
        return user


class SharedUserRateThrottle(UserRateThrottle):
    """DRF's per-user rate (``DEFAULT_THROTTLE_RATES["user"]``), counted across processes.

    DRF's own throttles keep their history in Django's cache, which is per process here: with N
    web processes a user got N times the rate. This one counts fixed windows of the rate's
    duration in Redis (:mod:`tenants.kv`; in-process while Redis is away). The cache key DRF
    builds is hashed before it reaches Redis (for anonymous callers it holds the client address).
    Anonymous callers are identified by the one client-address rule: DRF's own ``get_ident``
    would take a client's ``X-Forwarded-For`` at its word.
    """

    def get_ident(self, request: Any) -> str:
        """The client address (:func:`tenants.clientaddr.from_request`)."""
        return clientaddr.from_request(getattr(request, "_request", request))

    def allow_request(self, request: Any, view: Any) -> bool:
        """Count this request in the current window; False once the window's budget is spent."""
        if self.rate is None:
            return True
        ident = self.get_cache_key(request, view)
        if ident is None:
            return True
        duration = float(self.duration)
        window = int(time.time() // duration)
        key = kv.key(f"api:{hashlib.sha256(ident.encode()).hexdigest()[:32]}:{window}")
        ttl = int(duration) + 1

        def remote(r: Any) -> int:
            pipe = r.pipeline(transaction=False)
            pipe.incr(key)
            pipe.expire(key, ttl)
            return int(pipe.execute()[0])

        count = kv.call(remote, fallback=lambda store: store.incr(key, ttl_s=ttl))
        self._retry_after = (window + 1) * duration - time.time()
        return count <= int(self.num_requests)

    def wait(self) -> float | None:
        """Seconds until the window ends."""
        return max(0.0, getattr(self, "_retry_after", 0.0))


class AuditTokenAuthentication(BaseAuthentication):
    """A bearer token of the built-in authorization server (django-oauth-toolkit), for an operator.

    The token acts for the Django user it was issued to (authorization code flow) or, for the
    client-credentials grant, the user who owns the application (``Application.user``). It
    authenticates that user; ``request.auth`` is the access token, and the API then requires the
    ``audit:read`` scope (granted now by the application's and the membership's grants, see
    :func:`token_has_audit_scope`) and limits the caller to the application's tenant, where the
    user must still hold the auditor or tenant-admin role (:mod:`tenants.roles`). An unknown,
    expired or ownerless token is a 401; the token itself never reaches a log.
    """

    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        """(operator, access token) for a valid bearer token, None when there is none."""
        from oauth2_provider.models import get_access_token_model

        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise AuthenticationFailed("Malformed bearer token.")
        try:
            token = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("Malformed bearer token.") from None
        if not _B64TOKEN.match(token):
            raise AuthenticationFailed("Malformed bearer token.")
        checksum = hashlib.sha256(token.encode()).hexdigest()
        access = (get_access_token_model().objects
                  .select_related("user", "application__user", "application__tenant_link")
                  .filter(token_checksum=checksum).first())
        if access is None or access.is_expired():
            raise AuthenticationFailed("Invalid, revoked or expired access token.")
        application = access.application
        if application is None or getattr(application, "tenant_link", None) is None:
            raise AuthenticationFailed("The token's client belongs to no tenant.")
        operator = access.user or application.user
        if operator is None or not operator.is_active:
            raise AuthenticationFailed("The token acts for no operator.")
        return operator, access

    def authenticate_header(self, request: Any) -> str:
        """A 401 names the Bearer scheme and the scope the API needs."""
        return f'Bearer realm="api", scope="{AUDIT_READ_SCOPE}"'


def is_token(auth: Any) -> bool:
    """Whether ``request.auth`` is an OAuth access token (not a session or Basic sign-in)."""
    from oauth2_provider.models import get_access_token_model

    return isinstance(auth, get_access_token_model())


def token_tenant_id(auth: Any) -> int:
    """The tenant of the token's application (the only tenant the token reads)."""
    return int(auth.application.tenant_link.tenant_id)


def token_has_audit_scope(auth: Any) -> bool:
    """The token carries ``audit:read`` and the operator's grants allow it *now*.

    Narrowing the application's (or, for a user's token, the membership's) allowed scopes applies
    to tokens already issued, as for MCP tokens (:mod:`tenants.auth`).
    """
    from tenants.models import TenantMembership

    if AUDIT_READ_SCOPE not in (auth.scope or "").split():
        return False
    link = auth.application.tenant_link
    if AUDIT_READ_SCOPE not in link.scope_set():
        return False
    if auth.user_id is not None:
        membership = TenantMembership.objects.filter(tenant_id=link.tenant_id, user_id=auth.user_id).first()
        return membership is not None and AUDIT_READ_SCOPE in membership.scope_set()
    return True
