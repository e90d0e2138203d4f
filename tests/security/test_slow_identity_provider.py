"""Item 5: a slow identity provider delays only its own tokens, never other requests."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.client import ACCEPT_BOTH, McpClient
from tests.support.oauth import JwksServer, KeyPair
from tests.support.servers import Proc, Stack
from tests.support.waiting import wait_for

SLOW_ISS = "https://slow-idp.example.test/"


@pytest.fixture(scope="module")
def slow_idp() -> Iterator[JwksServer]:
    server = JwksServer()
    server.keys = [KeyPair("known").jwk]
    server.delay_s = 4.0
    yield server
    server.close()


@pytest.fixture(scope="module")
def web(stack: Stack, slow_idp: JwksServer) -> Iterator[Proc]:
    stack.manage("shell", "-c", (
        "from tenants.models import ExternalIssuer; from tenants.services import get_or_create_tenant\n"
        f"ExternalIssuer.objects.create(tenant=get_or_create_tenant(slug='slowco'), issuer={SLOW_ISS!r}, "
        f"jwks_url={slow_idp.url!r}, tenant_claim='org', tenant_claim_value='slowco')"
    ))
    # The identity provider listens on loopback: allowed explicitly (tenants.outbound).
    proc = stack.daphne(embedded_worker=False, extra_env={"MCPTASKS_ALLOW_ANONYMOUS": "0",
                                                          "MCPTASKS_OUTBOUND_ALLOWED_NETWORKS": "127.0.0.0/8"})
    yield proc
    proc.terminate(timeout=10)


def test_ping_stays_fast_while_tokens_of_a_slow_issuer_are_in_flight(
    stack: Stack, web: Proc, slow_idp: JwksServer
) -> None:
    token = stack.token("fastco", "alice")
    with McpClient(web.url, token=token) as c:
        c.initialize()
        bad_key = KeyPair("unknown-kid")
        now = int(time.time())
        bad = [bad_key.sign({"iss": SLOW_ISS, "aud": web.url, "sub": f"u{i}", "org": "slowco", "iat": now,
                             "exp": now + 300}) for i in range(10)]
        statuses: list[int] = []

        def send(tok: str) -> None:
            r = httpx.post(web.url, headers={"Authorization": f"Bearer {tok}", "Accept": ACCEPT_BOTH,
                                             "Content-Type": "application/json"},
                           json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=30)
            statuses.append(r.status_code)

        fetches_before = slow_idp.hits
        threads = [threading.Thread(target=send, args=(t,), daemon=True) for t in bad]
        for t in threads:
            t.start()
        wait_for("the slow JWKS fetch to be under way", lambda: slow_idp.hits > fetches_before, timeout=10,
                 every=0.01)
        latencies = []
        while any(t.is_alive() for t in threads) and len(latencies) < 40:
            t0 = time.monotonic()
            assert c.request("ping").result == {}
            latencies.append(time.monotonic() - t0)
            time.sleep(0.05)
        for t in threads:
            t.join(30)
    assert len(latencies) >= 5, "the slow tokens finished before the measurement"
    assert statistics.median(latencies) < 0.1 and max(latencies) < 0.5, latencies
    assert statuses == [401] * 10
    assert slow_idp.hits <= 2, f"{slow_idp.hits} JWKS fetches for 10 concurrent tokens (single flight)"
