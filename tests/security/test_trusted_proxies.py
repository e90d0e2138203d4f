"""Issue 25 item 10: behind a reverse proxy on the same host, loopback proves nothing.

``/metrics`` needs its token outside DEBUG; the client address of every address-based decision
(sign-in throttle, authentication-failure audit and flags, the ``/metrics`` loopback rule) comes
from one function that honours ``X-Forwarded-For`` only from a trusted proxy; and wrong passwords
slow down their own username+address instead of locking the account for everyone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import channel_layers
from channels.testing import HttpCommunicator
from django.core import checks
from django.test import Client

from mcptasks.asgi import router
from mcptasks.models import AuditEvent

PROXY = {"REMOTE_ADDR": "127.0.0.1"}  # a reverse proxy on the same host


def _via_proxy(client_ip: str) -> dict[str, str]:
    return {**PROXY, "HTTP_X_FORWARDED_FOR": client_ip}


@pytest.fixture
def behind_proxy(settings: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "TRUSTED_PROXIES": ("127.0.0.1/32", "::1/128")}


# --- /metrics ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_metrics_outside_debug_need_the_token_even_from_loopback(settings: Any) -> None:
    settings.DEBUG = False
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": ""}
    # Through a same-host proxy (or from the host itself): refused without a token.
    assert Client(**_via_proxy("203.0.113.5")).get("/metrics").status_code == 403
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 403
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": "m" * 32}
    assert Client(**_via_proxy("203.0.113.5")).get(
        "/metrics", HTTP_AUTHORIZATION="Bearer " + "m" * 32).status_code == 200


@pytest.mark.django_db
def test_metrics_in_debug_use_the_forwarded_client_not_the_proxy(settings: Any, behind_proxy: None) -> None:
    settings.DEBUG = True
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": ""}
    assert Client(**_via_proxy("203.0.113.5")).get("/metrics").status_code == 403
    assert Client(**_via_proxy("127.0.0.1")).get("/metrics").status_code == 200
    # A client that is not a trusted proxy cannot claim loopback.
    assert Client(REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="127.0.0.1").get("/metrics").status_code == 403


@pytest.mark.django_db
def test_a_missing_metrics_token_outside_debug_is_a_deploy_warning(settings: Any) -> None:
    settings.DEBUG = False
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": ""}
    ids = {m.id for m in checks.run_checks(include_deployment_checks=True)}
    assert "mcptasks.W005" in ids
    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": "m" * 32}
    assert "mcptasks.W005" not in {m.id for m in checks.run_checks(include_deployment_checks=True)}


# --- the one client-address function -----------------------------------------------------------


def test_forwarded_for_is_honoured_only_from_a_trusted_proxy(settings: Any, behind_proxy: None) -> None:
    from tenants.clientaddr import client_address

    # Rightmost hop that is not a trusted proxy; client-written hops to its left prove nothing.
    assert client_address("127.0.0.1", ["1.1.1.1, 203.0.113.7"]) == "203.0.113.7"
    assert client_address("127.0.0.1", ["1.1.1.1", "203.0.113.7, 127.0.0.1"]) == "203.0.113.7"
    # From an untrusted peer the header is ignored.
    assert client_address("198.51.100.4", ["127.0.0.1"]) == "198.51.100.4"
    # Garbage hops stop the walk; the result is always a parsed address.
    assert client_address("127.0.0.1", ["evil\r\nkey, 203.0.113.7"]) == "203.0.113.7"
    assert client_address("127.0.0.1", ["203.0.113.7, evil"]) == "127.0.0.1"
    assert client_address("::ffff:127.0.0.1", ["[2001:db8::1]:443"]) == "2001:db8::1"
    assert client_address("not an ip", ["203.0.113.7"]) == "unknown"
    assert client_address("127.0.0.1", ["203.0.113.7, " + "10.0.0.1, " * 100_000]) == "10.0.0.1"
    settings.TENANTS = {**settings.TENANTS, "TRUSTED_PROXIES": ("10.0.0.0/8", "127.0.0.1")}
    assert client_address("127.0.0.1", ["203.0.113.7, 10.1.2.3"]) == "203.0.113.7"


def test_the_api_throttle_identifies_anonymous_callers_by_the_same_rule(behind_proxy: None) -> None:
    from django.test import RequestFactory

    from mcptasks.console.api_auth import SharedUserRateThrottle

    throttle = SharedUserRateThrottle()
    spoofed = RequestFactory().get("/api/", REMOTE_ADDR="198.51.100.4", HTTP_X_FORWARDED_FOR="127.0.0.1")
    assert throttle.get_ident(spoofed) == "198.51.100.4"
    proxied = RequestFactory().get("/api/", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="1.1.1.1, 203.0.113.7")
    assert throttle.get_ident(proxied) == "203.0.113.7"


def test_the_audit_and_flags_key_on_the_forwarded_client(behind_proxy: None) -> None:
    from mcptasks.audit import watch

    scope = {"client": ["127.0.0.1", 4000], "headers": [(b"x-forwarded-for", b"203.0.113.7")]}
    assert watch.client_ip(scope) == "203.0.113.7"


@pytest.mark.django_db(transaction=True)
async def test_an_authentication_failure_through_the_proxy_is_audited_with_the_client(
    settings: Any, behind_proxy: None
) -> None:
    from mcptasks.audit import watch

    watch.throttle.clear()
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends = {}
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}
    comm = HttpCommunicator(router, "POST", "/mcp", body=json.dumps(body).encode(), headers=[
        (b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"), (b"authorization", b"Bearer not-a-real-token"),
        (b"x-forwarded-for", b"203.0.113.77"),
    ])
    comm.scope["client"] = ["127.0.0.1", 40000]
    response = await comm.get_response(timeout=10)
    channel_layers.backends = {}
    assert response["status"] == 401
    event = await sync_to_async(AuditEvent.objects.get)(action="auth.failed")
    assert event.data["ip"] == "203.0.113.77"


# --- sign-in: slow down the attacker, never lock the account -----------------------------------


class _Clock:
    def __init__(self) -> None:
        import time

        self.now = time.time()

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    from tenants import oauth

    fake = _Clock()
    monkeypatch.setattr(oauth, "time", fake, raising=False)
    return fake


@pytest.mark.django_db
def test_ten_wrong_passwords_do_not_lock_out_the_operator(behind_proxy: None, django_user_model: Any) -> None:
    django_user_model.objects.create_superuser(username="ops", password="x-long-passphrase-9", email="")
    attacker = Client(**_via_proxy("203.0.113.66"))
    for _ in range(10):
        assert attacker.post("/admin/login/", {"username": "ops", "password": "wrong"}).status_code in (200, 429)
    # The operator, through the same proxy from another address, signs in at once, on every way in.
    operator = Client(**_via_proxy("198.51.100.20"))
    response = operator.post("/admin/login/", {"username": "ops", "password": "x-long-passphrase-9",
                                               "next": "/admin/"})
    assert response.status_code == 302
    assert Client(**_via_proxy("198.51.100.21")).post(
        "/accounts/login/", {"username": "ops", "password": "x-long-passphrase-9"}).status_code == 302


@pytest.mark.django_db
@pytest.mark.parametrize("store", ["shared", "in-process"])
def test_failures_slow_down_progressively_per_username_and_address(
    settings: Any, behind_proxy: None, clock: _Clock, django_user_model: Any, store: str
) -> None:
    if store == "in-process":  # no Redis: the counters' in-process fallback
        from tenants import kv

        settings.REDIS_URL = ""
        kv.reset()
    settings.TENANTS = {**settings.TENANTS, "LOGIN_FREE_FAILURES": 3, "LOGIN_DELAY_BASE_S": 2.0,
                        "LOGIN_DELAY_MAX_S": 60.0}
    django_user_model.objects.create_user(username="dave", password="x-long-passphrase-1")
    attacker = Client(**_via_proxy("203.0.113.66"))

    def attempt(password: str = "wrong") -> Any:
        return attacker.post("/accounts/login/", {"username": "dave", "password": password})

    for _ in range(3):
        assert attempt().status_code == 200  # the free failures
    waits = []
    for _ in range(6):
        refused = attempt()
        assert refused.status_code == 429  # not even the password is looked at
        waits.append(int(refused["Retry-After"]))
        clock.now += waits[-1]  # wait as told, then fail once more
        assert attempt().status_code == 200
    assert waits == [2, 4, 8, 16, 32, 60]  # doubling, capped
    assert AuditEvent.objects.filter(action="login.throttled").exists()
    # The right password from the attacker's address still waits; from elsewhere it works.
    assert attempt("x-long-passphrase-1").status_code == 429
    assert Client(**_via_proxy("198.51.100.20")).post(
        "/accounts/login/", {"username": "dave", "password": "x-long-passphrase-1"}).status_code == 302


@pytest.mark.django_db
def test_the_address_budget_counts_the_forwarded_client_not_the_proxy(settings: Any, behind_proxy: None) -> None:
    settings.TENANTS = {**settings.TENANTS, "LOGIN_MAX_FAILURES_PER_IP": 4}
    for i in range(4):
        Client(**_via_proxy("203.0.113.66")).post("/accounts/login/", {"username": f"u{i}", "password": "wrong"})
    assert Client(**_via_proxy("203.0.113.66")).post(
        "/accounts/login/", {"username": "fresh", "password": "wrong"}).status_code == 429
    # Everyone else behind the same proxy keeps their own budget.
    assert Client(**_via_proxy("198.51.100.8")).post(
        "/accounts/login/", {"username": "fresh", "password": "wrong"}).status_code == 200


@pytest.fixture(autouse=True)
def _no_layer_leftovers() -> Iterator[None]:
    yield
    channel_layers.backends = {}
