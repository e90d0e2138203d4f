"""Authentication of the audit-review API (its own module: DRF imports it while loading its settings)."""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import BasicAuthentication
from rest_framework.exceptions import AuthenticationFailed, Throttled

from tenants import oauth


class ThrottledBasicAuthentication(BasicAuthentication):
    """HTTP Basic credentials with the failed-password budgets of the sign-in pages.

    Without them the API would be a way around the sign-in throttle for guessing passwords.
    """

    def authenticate_credentials(self, userid: str, password: str, request: Any = None) -> Any:
        """Refuse (429) once the address or username used up its budget; count failures."""
        django_request = getattr(request, "_request", request)
        if oauth.sign_in_refused(django_request, userid):
            raise Throttled(detail="Too many failed sign-ins. Wait a few minutes and try again.")
        try:
            return super().authenticate_credentials(userid, password, request)
        except AuthenticationFailed:
            oauth.sign_in_failed(django_request, userid)
            raise
