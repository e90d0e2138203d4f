"""The built-in authorization server's tenant rules (django-oauth-toolkit validator and views).

* **Scopes are granted, not asked for.** A token may carry only scopes its application was
  granted by an operator (``TenantApplication.allowed_scopes``) and, for a user, that the
  user's membership of the tenant allows. Asking for more is ``invalid_scope`` (RFC 6749
  §5.2) and is audited; asking for nothing gives the defaults the grants allow.
* **Users act only in tenants they belong to.** The authorization endpoint shows a non-member
  an error page (audited) instead of the consent form, and the resource server refuses tokens
  of users who are not (or no longer) members.
* **Sign-in slows down** per username and client address (a wait that doubles with each
  failure), and each client address has a failure budget; accounts are never locked.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from oauth2_provider.oauth2_validators import OAuth2Validator
from oauth2_provider.views import AuthorizationView

from tenants import clientaddr, conf, kv
from tenants.models import TenantApplication, TenantMembership
from tenants.signals import emit


def allowed_scopes(*, application_id: int, user: Any = None) -> frozenset[str]:
    """The most a token of this application (for ``user``, if given) may carry; empty if none."""
    link = TenantApplication.objects.filter(application_id=application_id).only("tenant_id", "allowed_scopes").first()
    if link is None:
        return frozenset()
    allowed = link.scope_set()
    if user is not None and getattr(user, "is_authenticated", False):
        membership = TenantMembership.objects.filter(tenant_id=link.tenant_id, user=user).first()
        allowed = allowed & membership.scope_set() if membership is not None else frozenset()
    return allowed


def _tenant_of(application_id: int) -> int | None:
    return TenantApplication.objects.filter(application_id=application_id).values_list("tenant_id", flat=True).first()


class TenantOAuth2Validator(OAuth2Validator):
    """DOT's validator, with scopes bounded by the application's and the membership's grants."""

    def validate_scopes(self, client_id: str, scopes: list[str], client: Any, request: Any, *args: Any,
                        **kwargs: Any) -> bool:
        """Known scopes, all within what the application (and user) were granted."""
        if not super().validate_scopes(client_id, scopes, client, request, *args, **kwargs):
            return False
        user = getattr(request, "user", None)
        granted = allowed_scopes(application_id=client.pk, user=user)
        if set(scopes) <= granted:
            return True
        emit(
            action="oauth.invalid_scope",
            tenant_id=_tenant_of(client.pk),
            data={"client_id": str(client_id)[:100], "requested": " ".join(sorted(scopes))[:200],
                  "granted": " ".join(sorted(granted))},
        )
        return False

    def get_default_scopes(self, client_id: str, request: Any, *args: Any, **kwargs: Any) -> list[str]:
        """The configured defaults that the application (and user) were granted."""
        defaults = super().get_default_scopes(client_id, request, *args, **kwargs)
        client = getattr(request, "client", None)
        if client is None:
            return list(defaults)
        granted = allowed_scopes(application_id=client.pk, user=getattr(request, "user", None))
        return [s for s in defaults if s in granted]


class TenantAuthorizationView(AuthorizationView):
    """DOT's consent page, shown only to members of the application's tenant."""

    def _refuse_non_member(self, request: HttpRequest) -> HttpResponse | None:
        client_id = request.GET.get("client_id") or request.POST.get("client_id") or ""
        link = (
            TenantApplication.objects.select_related("tenant")
            .filter(application__client_id=client_id[:100])
            .first()
        )
        if link is None:
            return None  # DOT answers an unknown client itself
        if TenantMembership.objects.filter(tenant_id=link.tenant_id, user_id=request.user.pk or 0).exists():
            return None
        emit(
            action="oauth.not_member",
            tenant_id=link.tenant_id,
            data={"client_id": client_id[:100], "user": str(request.user.get_username())[:150]},
        )
        return render(
            request,
            "tenants/oauth_error.html",
            {"title": "Not a member of this tenant",
             "message": "Your account is not a member of the organisation this application belongs to. "
                        "Ask its operator to add you."},
            status=403,
        )

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """Consent form for members; an error page for everyone else."""
        return self._refuse_non_member(request) or super().get(request, *args, **kwargs)

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """Consent answer, from members only."""
        return self._refuse_non_member(request) or super().post(request, *args, **kwargs)


def _digest(text: str) -> str:
    # Client strings never become keys: a username or an address only as its hash.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _keys(request: HttpRequest, username: str | None) -> tuple[str, str, str]:
    """(address budget key, username+address failure counter key, username+address wait key)."""
    username = str(request.POST.get("username", "") if username is None else username)[:150].lower()
    address = _digest(clientaddr.from_request(request))
    pair = _digest(f"{username}\x00{address}")
    return f"login:ip:{address}", f"login:fails:{pair}", f"login:wait:{pair}"


def _failures(key: str) -> int:
    return int(kv.call(lambda r: r.get(kv.key(key)) or 0, fallback=lambda store: store.get(kv.key(key)) or 0))


def _count_failure(key: str, *, sliding: bool = False) -> int:
    """Add a failure; the count lapses ``LOGIN_WINDOW_S`` after the first one, or with
    ``sliding`` after the latest one (in-process fallback: after the first)."""
    window = conf.get().LOGIN_WINDOW_S

    def remote(r: Any) -> int:
        pipe = r.pipeline(transaction=False)
        pipe.incr(kv.key(key))
        pipe.expire(kv.key(key), window, nx=not sliding)
        return int(pipe.execute()[0])

    return kv.call(remote, fallback=lambda store: store.incr(kv.key(key), ttl_s=window))


def _wait_until(key: str) -> float:
    value = kv.call(lambda r: r.get(kv.key(key)), fallback=lambda store: store.get(kv.key(key)))
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


def _set_wait(key: str, until: float, seconds: float) -> None:
    ttl = max(1, math.ceil(seconds))
    kv.call(lambda r: r.set(kv.key(key), repr(until), ex=ttl),
            fallback=lambda store: store.getset(kv.key(key), repr(until), ttl_s=ttl) and None)


def _forget(*keys: str) -> None:
    def remote(r: Any) -> None:
        r.delete(*(kv.key(k) for k in keys))

    def local(store: Any) -> None:
        for k in keys:
            store.getset(kv.key(k), None, ttl_s=0)  # expired at once: forgotten

    kv.call(remote, fallback=local)


def sign_in_delay(failures: int) -> float:
    """Seconds the next attempt must wait after ``failures`` failed ones (0 while free)."""
    s = conf.get()
    extra = failures - s.LOGIN_FREE_FAILURES
    if extra < 0:
        return 0.0
    return float(min(s.LOGIN_DELAY_MAX_S, s.LOGIN_DELAY_BASE_S * 2 ** min(extra, 40)))


class ThrottledLoginView(auth_views.LoginView):
    """Django's sign-in, refusing (429) while a username+address waits or an address is out of budget."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """Check the failure budgets before looking at the password at all."""
        if sign_in_refused(request):
            return too_many_sign_ins(request)
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form: Any) -> HttpResponse:
        """Count the failure (address budget, username+address wait)."""
        sign_in_failed(self.request)
        return super().form_invalid(form)

    def form_valid(self, form: Any) -> HttpResponse:
        """Forget this username's failures from this address."""
        sign_in_succeeded(self.request)
        return super().form_valid(form)


def sign_in_refused(request: HttpRequest, username: str | None = None) -> bool:
    """Whether this sign-in must not even look at the password (then emit why).

    Refused while the username, from this client address, is still waiting after its last
    failure (the wait grows with each failure: :func:`sign_in_delay`), or when the address used
    up its failure budget. Never because of failures from *other* addresses: an attacker's
    wrong passwords slow the attacker down, not the account's owner. The rules are shared by
    every way to sign in with a password: the sign-in page, the admin's and HTTP Basic
    credentials on the audit API.
    """
    ip_key, _fails_key, wait_key = _keys(request, username)
    remaining = _wait_until(wait_key) - time.time()
    if remaining > 0:
        wait_s = max(1, math.ceil(round(remaining, 3)))  # not 3 s for a float hair above 2
        request.sign_in_retry_after = wait_s  # type: ignore[attr-defined]
        emit(action="login.throttled", tenant_id=None, data={"kind": "delay", "wait_s": wait_s})
        return True
    if _failures(ip_key) >= conf.get().LOGIN_MAX_FAILURES_PER_IP:
        request.sign_in_retry_after = conf.get().LOGIN_WINDOW_S  # type: ignore[attr-defined]
        emit(action="login.throttled", tenant_id=None, data={"kind": "ip"})
        return True
    return False


def too_many_sign_ins(request: HttpRequest) -> HttpResponse:
    """The 429 page of a sign-in that must wait."""
    response = render(request, "tenants/oauth_error.html",
                      {"title": "Too many sign-in attempts",
                       "message": "Too many failed sign-ins. Wait a little and try again."},
                      status=429)
    response["Retry-After"] = str(getattr(request, "sign_in_retry_after", conf.get().LOGIN_WINDOW_S))
    return response


def sign_in_failed(request: HttpRequest, username: str | None = None) -> None:
    """Count one failed password sign-in: against the address's budget, and the username's
    failures from this address (which set the wait before its next attempt)."""
    ip_key, fails_key, wait_key = _keys(request, username)
    _count_failure(ip_key)
    # Sliding: an attacker who keeps guessing keeps growing the wait; a quiet window resets it.
    delay = sign_in_delay(_count_failure(fails_key, sliding=True))
    if delay > 0:
        _set_wait(wait_key, time.time() + delay, delay)


def sign_in_succeeded(request: HttpRequest, username: str | None = None) -> None:
    """A correct password: this username's failures from this address are forgotten."""
    _ip_key, fails_key, wait_key = _keys(request, username)
    _forget(fails_key, wait_key)


def throttled_admin_login(view: Any) -> Any:
    """The admin's sign-in with the same failure budgets as :class:`ThrottledLoginView`."""

    def login(request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if request.method == "POST" and sign_in_refused(request):
            return too_many_sign_ins(request)
        response = view(request, extra_context)
        # The admin answers a failed sign-in by showing the form again (200); success redirects.
        if request.method == "POST" and response.status_code == 200:
            sign_in_failed(request)
        elif request.method == "POST" and response.status_code == 302:
            sign_in_succeeded(request)
        return response

    return login
