"""The built-in authorization server's tenant rules (django-oauth-toolkit validator and views).

* **Scopes are granted, not asked for.** A token may carry only scopes its application was
  granted by an operator (``TenantApplication.allowed_scopes``) and, for a user, that the
  user's membership of the tenant allows. Asking for more is ``invalid_scope`` (RFC 6749
  §5.2) and is audited; asking for nothing gives the defaults the grants allow.
* **Users act only in tenants they belong to.** The authorization endpoint shows a non-member
  an error page (audited) instead of the consent form, and the resource server refuses tokens
  of users who are not (or no longer) members.
* **Sign-in is throttled** per client address and per username.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from oauth2_provider.oauth2_validators import OAuth2Validator
from oauth2_provider.views import AuthorizationView

from . import conf, kv
from .models import TenantApplication, TenantMembership
from .signals import emit


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


def _client_ip(request: HttpRequest) -> str:
    return str(request.META.get("REMOTE_ADDR", ""))[:64]


def _throttle_keys(request: HttpRequest, username: str | None = None) -> list[tuple[str, int]]:
    s = conf.get()
    username = str(request.POST.get("username", "") if username is None else username)[:150].lower()
    digest = hashlib.sha256(username.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    prefix = "login"
    return [
        (f"{prefix}:ip:{hashlib.sha256(_client_ip(request).encode()).hexdigest()[:32]}", s.LOGIN_MAX_FAILURES_PER_IP),
        (f"{prefix}:user:{digest}", s.LOGIN_MAX_FAILURES_PER_USER),
    ]


def _failures(key: str) -> int:
    return int(kv.call(lambda r: r.get(kv.key(key)) or 0, fallback=lambda store: store.get(kv.key(key)) or 0))


def _count_failure(key: str) -> None:
    window = conf.get().LOGIN_WINDOW_S

    def remote(r: Any) -> None:
        pipe = r.pipeline(transaction=False)
        pipe.incr(kv.key(key))
        pipe.expire(kv.key(key), window, nx=True)
        pipe.execute()

    kv.call(remote, fallback=lambda store: store.incr(kv.key(key), ttl_s=window) and None)


class ThrottledLoginView(auth_views.LoginView):
    """Django's sign-in, refusing (429) after too many failures per address or per username."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """Check the failure budgets before looking at the password at all."""
        if sign_in_refused(request):
            return too_many_sign_ins(request)
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form: Any) -> HttpResponse:
        """Count the failure against both budgets."""
        sign_in_failed(self.request)
        return super().form_invalid(form)


def sign_in_refused(request: HttpRequest, username: str | None = None) -> bool:
    """Whether this address or username has used up its failed sign-in budget (then emit why).

    The budgets are shared by every way to sign in with a password: the sign-in page, the
    admin's and HTTP Basic credentials on the audit API.
    """
    for key, limit in _throttle_keys(request, username):
        if _failures(key) >= limit:
            emit(action="login.throttled", tenant_id=None, data={"kind": key.split(":")[1]})
            return True
    return False


def too_many_sign_ins(request: HttpRequest) -> HttpResponse:
    """The 429 page of a used-up sign-in budget."""
    response = render(request, "tenants/oauth_error.html",
                      {"title": "Too many sign-in attempts",
                       "message": "Too many failed sign-ins. Wait a few minutes and try again."},
                      status=429)
    response["Retry-After"] = str(conf.get().LOGIN_WINDOW_S)
    return response


def sign_in_failed(request: HttpRequest, username: str | None = None) -> None:
    """Count one failed password sign-in against the address's and the username's budgets."""
    for key, _limit in _throttle_keys(request, username):
        _count_failure(key)


def throttled_admin_login(view: Any) -> Any:
    """The admin's sign-in with the same failure budgets as :class:`ThrottledLoginView`."""

    def login(request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if request.method == "POST" and sign_in_refused(request):
            return too_many_sign_ins(request)
        response = view(request, extra_context)
        # The admin answers a failed sign-in by showing the form again (200); success redirects.
        if request.method == "POST" and response.status_code == 200:
            sign_in_failed(request)
        return response

    return login
