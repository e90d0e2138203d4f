"""Issue 25.7: what one principal may make the server keep (sessions, client metadata, streams).

Before: every ``initialize`` and every 2026-07-28 ``tools/call`` stored ``clientInfo`` and the
capabilities whatever their size (kept 24 h), and one principal could hold any number of
sessions and GET streams. Now the stored sizes are bounded (-32602), live sessions and open GET
streams per principal are capped, and sessions that never initialized and the rows of 2026
requests expire within minutes.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.live_support import Listener
from tests.support.client import ACCEPT_BOTH, McpClient
from tests.support.servers import Proc, Stack
from tests.support.waiting import wait_for

MAX_SESSIONS = 4
MAX_STREAMS = 3
#: Well under the 4 MiB body limit: the size of the stored metadata is what is refused.
HUGE = "x" * 1_000_000


@pytest.fixture(scope="module")
def web(stack: Stack) -> Iterator[Proc]:
    procs = [stack.daphne(extra_env={
        "MCPTASKS_ALLOW_ANONYMOUS": "0",
        "MCPTASKS_MAX_SESSIONS_PER_PRINCIPAL": str(MAX_SESSIONS),
        "MCPTASKS_MAX_STREAMS_PER_PRINCIPAL": str(MAX_STREAMS),
    })]
    if stack.multi_process:
        procs.append(stack.worker(concurrency=2))
    yield procs[0]
    for p in procs:
        p.terminate(timeout=10)


def _session_bytes(stack: Stack) -> int:
    """The on-disk size of the session table (with its TOAST data), or the row data on SQLite."""
    code = (
        "from django.db import connection\n"
        "from mcptasks.models import McpSession\n"
        "with connection.cursor() as c:\n"
        "    if connection.vendor == 'postgresql':\n"
        "        c.execute(\"SELECT pg_total_relation_size('mcptasks_mcpsession')\")\n"
        "    else:\n"
        "        c.execute('SELECT COALESCE(SUM(LENGTH(client_info) + LENGTH(client_capabilities)), 0)"
        " FROM mcptasks_mcpsession')\n"
        "    print(c.fetchone()[0])\n"
    )
    return int(stack.manage("shell", "-c", code).stdout.strip().splitlines()[-1])


def _initialize(web: Proc, token: str, *, client_info: dict[str, Any] | None = None,
                capabilities: dict[str, Any] | None = None) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": capabilities if capabilities is not None else {},
        "clientInfo": client_info or {"name": "hostile", "version": "1"},
    }}
    headers = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    return httpx.post(web.url, json=body, headers=headers, timeout=60)


def _call_2026(web: Proc, token: str, *, client_info: dict[str, Any], capabilities: dict[str, Any]) -> httpx.Response:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": capabilities,
            "io.modelcontextprotocol/clientInfo": client_info}
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "demo_sleep", "arguments": {"ms": 0}, "_meta": meta}}
    headers = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json", "Authorization": f"Bearer {token}",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "demo_sleep"}
    return httpx.post(web.url, json=body, headers=headers, timeout=60)


def test_huge_client_metadata_is_refused_and_never_stored(web: Proc, stack: Stack) -> None:
    token = stack.token("limits-meta", principal="mallory")
    before = _session_bytes(stack)
    attempts = [
        _initialize(web, token, client_info={"name": "x", "version": "1", "blob": HUGE}),
        _initialize(web, token, capabilities={"experimental": {"blob": HUGE}}),
        _call_2026(web, token, client_info={"name": "x", "version": "1", "blob": HUGE}, capabilities={}),
        _call_2026(web, token, client_info={"name": "x", "version": "1"}, capabilities={"experimental": {"b": HUGE}}),
    ]
    for reply in attempts:
        assert reply.status_code == 200, reply.text[:300]
        error = reply.json()["error"]
        assert error["code"] == -32602, error
        assert "too large" in error["message"] and "8192" in error["message"], error
        assert "mcp-session-id" not in reply.headers
    # Nothing of the 4 MB sent was kept (PostgreSQL may grow a page or two for other rows).
    assert _session_bytes(stack) - before < 200_000
    # Metadata within the bound is still fine.
    ok = _initialize(web, token, client_info={"name": "x", "version": "1", "note": "y" * 4000})
    assert ok.status_code == 200 and "result" in ok.json(), ok.text[:300]


def test_live_sessions_per_principal_are_capped_even_when_raced(web: Proc, stack: Stack) -> None:
    alice = stack.token("limits-sessions", principal="alice")
    bob = stack.token("limits-sessions", principal="bob")
    replies: list[httpx.Response] = []

    def init() -> None:
        replies.append(_initialize(web, alice))

    threads = [threading.Thread(target=init) for _ in range(MAX_SESSIONS * 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    opened = [r for r in replies if "result" in r.json()]
    refused = [r.json()["error"] for r in replies if "error" in r.json()]
    assert len(opened) == MAX_SESSIONS, [r.text[:200] for r in replies]
    assert len(refused) == MAX_SESSIONS * 2
    assert all(e["code"] == -32010 and "Too many sessions" in e["message"] for e in refused), refused
    assert all(e["data"]["limit"] == MAX_SESSIONS for e in refused), refused
    # Another principal of the same tenant is not affected.
    assert "result" in _initialize(web, bob).json()
    # Ending a session (DELETE) frees its place.
    sid = opened[0].headers["mcp-session-id"]
    gone = httpx.delete(web.url, headers={"Authorization": f"Bearer {alice}", "Mcp-Session-Id": sid,
                                          "MCP-Protocol-Version": "2025-11-25"}, timeout=30)
    assert gone.status_code in (200, 204), gone.text
    assert "result" in _initialize(web, alice).json()


def test_open_get_streams_per_principal_are_capped(web: Proc, stack: Stack) -> None:
    token = stack.token("limits-streams", principal="carol")
    listeners: list[Listener] = []
    try:
        for _ in range(MAX_STREAMS):
            c = McpClient(web.url, token=token, timeout=60)
            c.initialize()
            listener = Listener(c).start()
            listener.wait_primed()
            listeners.append(listener)
        extra = McpClient(web.url, token=token, timeout=60)
        extra.initialize()
        h = extra.headers(Accept="text/event-stream")
        h.pop("Content-Type", None)
        # (A short read timeout: before the cap, this stream opened and never ended.)
        refused = extra.http.get(web.url, headers=h, timeout=5)
        assert refused.status_code == 429, refused.text[:300]
        assert "Too many open streams" in refused.json()["error"]["message"]
        assert refused.headers.get("retry-after")
        # Re-opening a stream this principal already holds (a reconnect) is still allowed.
        again = Listener(McpClient(web.url, token=token, timeout=60))
        again.client.session_id = listeners[0].client.session_id
        again.client.protocol_version = listeners[0].client.protocol_version
        again.start().wait_primed()
        listeners.append(again)
        # Once one closes, a new stream opens.
        for listener in listeners[:2]:
            listener.abort()
            listener.wait_done(10)
        # The server learns of a closed stream when its disconnect arrives, a moment after the
        # client closes: wait for that event (bounded), not a fixed time.
        def reopened() -> Listener | None:
            fresh = Listener(extra).start()
            fresh.wait_primed()
            return None if fresh.status == 429 else fresh

        fresh = wait_for("a stream slot freed by the closed streams", reopened, timeout=10, every=0.2)
        assert fresh.status is None and fresh.error is None, fresh.status
        listeners.append(fresh)
    finally:
        for listener in listeners:
            listener.abort()


# --- cleanup (in-process, explicit timestamps) ------------------------------------------------


@pytest.mark.django_db
def test_sessions_that_never_initialized_and_2026_request_rows_expire_within_minutes(tenant_a: Any) -> None:
    from django.utils import timezone

    from mcptasks import conf
    from mcptasks.models import McpSession, Task, TaskStatus
    from mcptasks.protocol.era2026 import VERSION
    from mcptasks.tasks import cleanup
    from tenants.services import get_or_create_principal

    principal = get_or_create_principal(tenant=tenant_a, kind="user", identifier="mallory")
    now = timezone.now()
    s = conf.get()

    def make(*, initialized: bool, version: str = "2025-11-25", age_s: float) -> McpSession:
        row = McpSession.objects.create(tenant=tenant_a, principal=principal, protocol_version=version,
                                        initialized=initialized)
        at = now - dt.timedelta(seconds=age_s)
        McpSession.objects.filter(pk=row.pk).update(created_at=at, last_seen_at=at)
        return row

    past_init = s.SESSION_INIT_TIMEOUT_S + 5
    never = make(initialized=False, age_s=past_init)
    young = make(initialized=False, age_s=s.SESSION_INIT_TIMEOUT_S - 30)
    used = make(initialized=True, age_s=past_init)
    old_2026 = make(initialized=True, version=VERSION, age_s=s.REQUEST_RETENTION_S + 5)
    busy_2026 = make(initialized=True, version=VERSION, age_s=s.REQUEST_RETENTION_S + 5)
    Task.objects.create(
        tenant=tenant_a, principal=principal, session_id=busy_2026.pk, tool_name="demo_sleep",
        kind=Task.Kind.REQUEST, status=TaskStatus.WORKING, request_id="1", stream_id="p0",
        created_at=now, last_updated_at=now,
    )
    fresh_2026 = make(initialized=True, version=VERSION, age_s=10)
    assert s.SESSION_INIT_TIMEOUT_S <= 600 and s.REQUEST_RETENTION_S <= 900  # "within minutes"

    counts = cleanup.cleanup_expired(now=now)

    left = set(McpSession.objects.values_list("pk", flat=True))
    assert never.pk not in left and old_2026.pk not in left
    assert {young.pk, used.pk, busy_2026.pk, fresh_2026.pk} <= left
    assert counts["sessions"] == 2


def test_stream_slots_count_distinct_streams_and_let_a_holder_reconnect() -> None:
    from mcptasks.endpoint.limits import StreamSlots

    slots = StreamSlots()
    alice, bob = (1, 10), (1, 11)
    assert slots.acquire(alice, "g1", limit=2) and slots.acquire(alice, "g2", limit=2)
    assert not slots.acquire(alice, "g3", limit=2)  # a third stream
    assert slots.acquire(bob, "g3", limit=2)  # another principal has its own count
    assert slots.acquire(alice, "g1", limit=2)  # a reconnect of a held stream (takes the old one over)
    assert not slots.acquire(alice, "g1", limit=2)  # but not a pile of connections to one stream
    slots.release(alice, "g1")
    slots.release(alice, "g1")
    assert slots.open_streams(alice) == 1
    assert slots.acquire(alice, "g3", limit=2)
    slots.release(alice, "unknown")  # never held: a no-op
    assert slots.open_streams(alice) == 2
