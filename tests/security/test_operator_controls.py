"""Issue 25 item 2: operator-only tenant controls, and ttl/limit bounds that hold everywhere.

A tenant admin must not undo what an operator decided for its tenant (suspension, quotas, rate
limits, ttl bounds, the slug): the real admin is driven over HTTP with CSRF checks on, and forged
POSTs that include those fields change nothing. Every ttl/limit field has a sane bound (model
validation and database check constraints), and the protocol layer clamps a huge ttl, requested
by a client or configured, instead of crashing with -32603 (both eras).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import channel_layers
from channels.testing import HttpCommunicator
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.test import Client
from django.urls import reverse

from mcptasks.asgi import router
from mcptasks.protocol.era2026 import TASKS_EXTENSION
from tenants import services as tenant_services
from tenants.models import TTL_MS_LIMIT, Tenant
from tenants.selectors import TenantRow, clear_limits_cache, limits_of

HUGE = 2**63 - 1
OPERATOR_FIELDS = {
    "slug": "stolen-slug", "active": "on", "max_concurrent_tasks": "", "max_concurrent_tasks_per_principal": "",
    "default_ttl_ms": str(HUGE), "max_ttl_ms": str(HUGE), "poll_interval_ms": "1",
    "rate_create_per_min": "", "rate_read_per_min": "", "rate_other_per_min": "",
}


# --- the admin, over HTTP with CSRF --------------------------------------------------------------


def _csrf(page: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert match, "no CSRF token on the page"
    return match.group(1)


def _signed_in(username: str, password: str) -> Client:
    client = Client(enforce_csrf_checks=True)
    login_page = client.get(reverse("admin:login"))
    response = client.post(reverse("admin:login"), {
        "username": username, "password": password, "next": "/admin/",
        "csrfmiddlewaretoken": _csrf(login_page.content.decode()),
    })
    assert response.status_code == 302, response.content[:500]
    return client


def _management_form(page: str) -> dict[str, str]:
    """Every inline formset's management form, submitting no inline rows (existing ones are kept)."""
    data = {}
    for prefix in set(re.findall(r'name="([^"]+)-TOTAL_FORMS"', page)):
        data.update({f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0",
                     f"{prefix}-MIN_NUM_FORMS": "0", f"{prefix}-MAX_NUM_FORMS": "1000"})
    assert data, "no inline formsets on the page"
    return data


@pytest.fixture
def suspended(db: None) -> Tenant:
    return Tenant.objects.create(
        slug="suspended", name="Acme", active=False, max_concurrent_tasks=5, max_concurrent_tasks_per_principal=2,
        default_ttl_ms=60_000, max_ttl_ms=600_000, poll_interval_ms=2000, rate_create_per_min=10,
        rate_read_per_min=100, rate_other_per_min=50,
    )


def _tenant_admin(tenant: Tenant) -> Client:
    user = get_user_model().objects.create_user(username="tadmin", password="pw-tadmin-Long-1")
    tenant_services.grant_operator_role(user=user, tenant=tenant, role="admin")
    return _signed_in("tadmin", "pw-tadmin-Long-1")


def _limits(tenant: Tenant) -> dict[str, Any]:
    return dict(Tenant.objects.filter(pk=tenant.pk).values(
        "slug", "active", "max_concurrent_tasks", "max_concurrent_tasks_per_principal", "default_ttl_ms",
        "max_ttl_ms", "poll_interval_ms", "rate_create_per_min", "rate_read_per_min", "rate_other_per_min",
    ).get())


def test_a_forged_post_by_a_tenant_admin_changes_no_operator_field(suspended: Tenant) -> None:
    before = _limits(suspended)
    client = _tenant_admin(suspended)
    url = reverse("admin:tenants_tenant_change", args=[suspended.pk])
    form = client.get(url)
    assert form.status_code == 200
    page = form.content.decode()
    # Shown, but not as inputs: read-only for a tenant admin.
    for field in OPERATOR_FIELDS:
        assert f'name="{field}"' not in page, field
    assert 'name="name"' in page
    assert "600000" in page and "suspended" in page  # the operator's values are shown, read-only
    response = client.post(url, {
        "csrfmiddlewaretoken": _csrf(page), "name": "Acme Corp", **OPERATOR_FIELDS,
        **_management_form(page), "_save": "Save",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    assert _limits(suspended) == before  # re-activation, blanked quotas, slug and ttl all ignored
    assert Tenant.objects.get(pk=suspended.pk).name == "Acme Corp"  # what they may change, changed
    # Without the CSRF token the same POST is refused outright.
    assert client.post(url, {"name": "x", **OPERATOR_FIELDS}).status_code == 403


def test_an_operator_cannot_store_a_huge_ttl_or_limit_either(suspended: Tenant) -> None:
    get_user_model().objects.create_superuser(username="root", password="pw-root-Long-1", email="")
    client = _signed_in("root", "pw-root-Long-1")
    url = reverse("admin:tenants_tenant_change", args=[suspended.pk])
    page = client.get(url).content.decode()
    response = client.post(url, {
        "csrfmiddlewaretoken": _csrf(page), "slug": "suspended", "name": "Acme", "default_ttl_ms": "60000",
        "max_ttl_ms": str(HUGE), "poll_interval_ms": "2000", "rate_create_per_min": str(2**31 - 1),
        **_management_form(page), "_save": "Save",
    })
    assert response.status_code == 200  # the form again, with errors
    assert "errorlist" in response.content.decode()
    assert _limits(suspended)["max_ttl_ms"] == 600_000
    # The operator may change the operator fields within the bounds.
    response = client.post(url, {
        "csrfmiddlewaretoken": _csrf(page), "slug": "suspended", "name": "Acme", "active": "on",
        "max_ttl_ms": str(TTL_MS_LIMIT), "poll_interval_ms": "2000", **_management_form(page), "_save": "Save",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    assert _limits(suspended)["active"] is True and _limits(suspended)["max_ttl_ms"] == TTL_MS_LIMIT


def test_the_database_refuses_out_of_bounds_limits(suspended: Tenant) -> None:
    for field, value in (("max_ttl_ms", HUGE), ("default_ttl_ms", TTL_MS_LIMIT + 1),
                         ("poll_interval_ms", 2**31 - 1), ("rate_read_per_min", 2**31 - 1)):
        with pytest.raises(IntegrityError), transaction.atomic():
            Tenant.objects.filter(pk=suspended.pk).update(**{field: value})


def test_a_tenant_admin_cannot_give_an_issuer_an_unbounded_leeway(suspended: Tenant) -> None:
    from tenants.models import LEEWAY_S_LIMIT, ExternalIssuer

    issuer = ExternalIssuer.objects.create(tenant=suspended, issuer="https://idp.example",
                                           jwks_url="https://idp.example/jwks")
    client = _tenant_admin(suspended)
    url = reverse("admin:tenants_externalissuer_change", args=[issuer.pk])
    page = client.get(url).content.decode()
    fields = {
        "tenant": suspended.pk, "name": "", "active": "on", "issuer": "https://idp.example",
        "jwks_url": "https://idp.example/jwks", "static_keys": "null", "shared_secret": "", "audience": "",
        "tenant_claim": "", "tenant_claim_value": "", "principal_claim": "sub", "scopes_claim": "scope",
        "algorithms": "RS256", "csrfmiddlewaretoken": _csrf(page),
    }
    # Expired tokens stay valid for 68 years with a leeway of 2^31-1 s: refused.
    response = client.post(url, {**fields, "leeway_s": str(2**31 - 1)})
    assert response.status_code == 200 and "errorlist" in response.content.decode()
    assert ExternalIssuer.objects.get(pk=issuer.pk).leeway_s == 30
    assert client.post(url, {**fields, "leeway_s": str(LEEWAY_S_LIMIT)}).status_code == 302
    assert ExternalIssuer.objects.get(pk=issuer.pk).leeway_s == LEEWAY_S_LIMIT
    with pytest.raises(IntegrityError), transaction.atomic():
        ExternalIssuer.objects.filter(pk=issuer.pk).update(leeway_s=LEEWAY_S_LIMIT + 1)


def test_every_bounded_limit_is_operator_only() -> None:
    from tenants.models import TENANT_LIMIT_BOUNDS
    from tenants.roles import OPERATOR_ONLY_TENANT_FIELDS

    assert set(TENANT_LIMIT_BOUNDS) | {"slug", "active"} == set(OPERATOR_ONLY_TENANT_FIELDS)
    assert set(OPERATOR_FIELDS) == set(OPERATOR_ONLY_TENANT_FIELDS)  # the forged POST tries them all


def test_stored_huge_bounds_are_clamped_when_read() -> None:
    limits = limits_of(TenantRow(default_ttl_ms=HUGE, max_ttl_ms=HUGE, poll_interval_ms=HUGE))
    assert limits.max_ttl_ms == TTL_MS_LIMIT and limits.default_ttl_ms == TTL_MS_LIMIT
    assert limits.poll_interval_ms <= 3_600_000


# --- the protocol layer: a huge ttl in both eras ------------------------------------------------


@pytest.fixture
def huge_global_bounds(settings: Any) -> Iterator[None]:
    """Anonymous callers, in-memory layer, and a configured max/default ttl of 2^63-1."""
    settings.TENANTS = {**settings.TENANTS, "ALLOW_ANONYMOUS": True, "TASK_MAX_TTL_MS": HUGE,
                        "TASK_DEFAULT_TTL_MS": HUGE}
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends = {}
    clear_limits_cache()
    yield
    channel_layers.backends = {}


BASE = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream")]


async def _post(body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    comm = HttpCommunicator(router, "POST", "/mcp", body=json.dumps(body).encode(), headers=headers)
    return await comm.get_response(timeout=20)  # type: ignore[no-any-return]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("ttl", [HUGE, 10**40])
async def test_a_huge_requested_ttl_is_clamped_in_2025_11_25(huge_global_bounds: None, ttl: int) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}
    response = await _post(init, BASE)
    sid = dict((k.decode().lower(), v.decode()) for k, v in response["headers"])["mcp-session-id"]
    headers = [*BASE, (b"mcp-session-id", sid.encode()), (b"mcp-protocol-version", b"2025-11-25")]
    assert (await _post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers))["status"] == 202
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "demo_sleep", "arguments": {"ms": 1}, "task": {"ttl": ttl}}}
    reply = await _post(call, headers)
    message = json.loads(reply["body"])
    assert "error" not in message, message
    assert message["result"]["task"]["ttl"] == TTL_MS_LIMIT


@pytest.mark.django_db(transaction=True)
async def test_a_huge_configured_ttl_is_clamped_in_2026_07_28(huge_global_bounds: None) -> None:
    version = "2026-07-28"
    params = {"name": "demo_ask", "arguments": {"question": "q"},
              "_meta": {"io.modelcontextprotocol/protocolVersion": version,
                        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}},
                        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}}
    headers = [*BASE, (b"mcp-protocol-version", version.encode()), (b"mcp-method", b"tools/call"),
               (b"mcp-name", b"demo_ask")]
    reply = await _post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}, headers)
    message = json.loads(reply["body"])
    assert "error" not in message, message
    assert message["result"]["resultType"] == "task" and message["result"]["ttlMs"] == TTL_MS_LIMIT
