"""A short-lived, bounded, per-process cache of verified bearer tokens.

Verifying a token costs a database query (built-in tokens) or a signature check and an issuer
lookup (external JWTs) on every request. A verified token's :class:`AuthContext` is kept here
for ``AUTH_CACHE_S`` (1 s by default), never past the token's own expiry, keyed by a SHA-256 of
the Authorization header and the resource it was presented at (the token itself is never kept).
Only successes are cached, so unknown or forged tokens cannot fill it; at most
``AUTH_CACHE_MAX_ENTRIES`` entries are kept (least recently used dropped first).

Changes made in this process (a token revoked or deleted, a tenant disabled, an application's
or member's grants narrowed, an issuer edited) clear the cache at once through model signals;
other processes see them when their entries lapse, within ``AUTH_CACHE_S``. While requests come,
an entry is verified again in the background before it lapses (:meth:`AuthCache.get_due`).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from typing import Any

from tenants import conf
from tenants.context import AuthContext
from tenants.infra.coalesce import refresh_due


class AuthCache:
    """Verified auth contexts by request credential, each valid until a deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (deadline, verdict, fingerprint of what it was decided from or None: tenants.auth_fingerprint)
        self._entries: OrderedDict[bytes, tuple[float, AuthContext, tuple[Any, ...] | None]] = OrderedDict()

    @staticmethod
    def key(*, authorization: str, resource_url: str) -> bytes:
        """The cache key of a credential presented at a resource (a digest: no token is stored)."""
        return hashlib.sha256(f"{authorization}\0{resource_url}".encode("utf-8", "surrogatepass")).digest()

    def get(self, key: bytes) -> AuthContext | None:
        """The cached context for ``key`` if it is still valid."""
        return self.get_due(key)[0]

    def get_due(self, key: bytes) -> tuple[AuthContext | None, bool]:
        """The cached context for ``key`` if it is still valid, and whether it is due to be
        verified again ahead of its lapse (:func:`tenants.infra.coalesce.refresh_due`).

        Issue 27: when a verdict lapsed, every request in flight with that credential waited for
        the one that verified it again; a process serving 20 tenants' tokens lapsed 20 times as
        often as one serving one. A caller told the entry is due verifies it in the background
        while requests go on with it (still within ``AUTH_CACHE_S`` of its verification).
        """
        now = time.time()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None, False
            if entry[0] <= now:
                del self._entries[key]
                return None, False
            self._entries.move_to_end(key)
            return entry[1], refresh_due(left_s=entry[0] - now, ttl_s=conf.get().AUTH_CACHE_S)

    def fingerprint(self, key: bytes) -> tuple[Any, ...] | None:
        """The fingerprint kept with ``key``'s still valid verdict (None: none, or no verdict)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry[2] if entry is not None and entry[0] > time.time() else None

    def drop(self, key: bytes) -> None:
        """Forget ``key``'s entry (its credential was refused when verified again)."""
        with self._lock:
            self._entries.pop(key, None)

    def put(self, key: bytes, ctx: AuthContext, fingerprint: tuple[Any, ...] | None = None) -> None:
        """Remember ``ctx`` for ``AUTH_CACHE_S``, never past its credential's expiry, with the
        fingerprint of what it was decided from (:mod:`tenants.auth_fingerprint`), if known."""
        settings = conf.get()
        if settings.AUTH_CACHE_S <= 0 or settings.AUTH_CACHE_MAX_ENTRIES <= 0:
            return
        deadline = time.time() + settings.AUTH_CACHE_S
        if ctx.expires_at is not None:
            deadline = min(deadline, ctx.expires_at)
        with self._lock:
            self._entries[key] = (deadline, ctx, fingerprint)
            self._entries.move_to_end(key)
            while len(self._entries) > settings.AUTH_CACHE_MAX_ENTRIES:
                self._entries.popitem(last=False)

    def clear(self, **_: Any) -> None:
        """Forget every entry (connected to the model signals that can change a verdict)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


#: The process-wide cache.
cache = AuthCache()


def connect_invalidation() -> None:
    """Clear the cache whenever a model that decides authentication changes in this process."""
    from django.core.signals import setting_changed
    from django.db.models.signals import post_delete, post_save
    from oauth2_provider.models import get_access_token_model, get_application_model

    from tenants.models import ExternalIssuer, Principal, Tenant, TenantApplication, TenantMembership

    for model in (get_access_token_model(), get_application_model(), Tenant, TenantApplication,
                  TenantMembership, Principal, ExternalIssuer):
        for name, signal in (("save", post_save), ("delete", post_delete)):
            signal.connect(cache.clear, sender=model, weak=False, dispatch_uid=f"auth-cache-{model.__name__}-{name}")
    setting_changed.connect(cache.clear, weak=False, dispatch_uid="auth-cache-settings")
