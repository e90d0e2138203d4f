"""The MCP consumer driven in-process with Channels' HttpCommunicator (no daphne).

End-to-end tests against real daphne processes live in tests/e2e; these exercise the same
consumer through the ASGI interface, with the worker running in the test's own event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import (
    async_to_sync,
    sync_to_async,  # noqa: I001
)
from channels.testing import HttpCommunicator
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcptasks.asgi import router
from mcptasks.worker.loop import Worker
from tests.support.client import iter_sse
from tests.support.schema import validate_server_message

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("anonymous_in_memory")]

BASE_HEADERS = [
    (b"host", b"127.0.0.1:8000"),
    (b"content-type", b"application/json"),
    (b"accept", b"application/json, text/event-stream"),
]
INIT = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


async def post(body: Any, headers: list[tuple[bytes, bytes]] | None = None, *, raw: bytes | None = None,
               timeout: float = 10) -> dict[str, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    comm = HttpCommunicator(router, "POST", "/mcp", body=data, headers=headers or BASE_HEADERS)
    return await comm.get_response(timeout=timeout)  # type: ignore[no-any-return]


def headers_of(response: dict[str, Any]) -> dict[str, str]:
    return {k.decode().lower(): v.decode() for k, v in response["headers"]}


async def initialize() -> list[tuple[bytes, bytes]]:
    response = await post(INIT)
    assert response["status"] == 200
    message = json.loads(response["body"])
    validate_server_message(message, "initialize")
    sid = headers_of(response)["mcp-session-id"]
    headers = [*BASE_HEADERS, (b"mcp-session-id", sid.encode()), (b"mcp-protocol-version", b"2025-11-25")]
    done = await post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    assert done["status"] == 202
    return headers


async def test_initialize_assigns_a_session_and_negotiates_the_latest_revision() -> None:
    response = await post(INIT)
    assert response["status"] == 200
    body = json.loads(response["body"])
    assert body["result"]["protocolVersion"] == "2025-11-25"
    sid = headers_of(response)["mcp-session-id"]
    assert len(sid) >= 22 and all(0x21 <= ord(c) <= 0x7E for c in sid)


async def test_http_rules_are_enforced_before_dispatch() -> None:
    no_accept = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"), (b"accept", b"application/json")]
    assert (await post(INIT, no_accept))["status"] == 406
    bad_type = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"text/plain"),
                (b"accept", b"application/json, text/event-stream")]
    assert (await post(INIT, bad_type))["status"] == 415
    evil_host = [(b"host", b"evil.example.com"), *BASE_HEADERS[1:]]
    assert (await post(INIT, evil_host))["status"] == 400
    origin = [*BASE_HEADERS, (b"origin", b"http://evil.example.com")]
    forbidden = await post(INIT, origin)
    assert forbidden["status"] == 403
    assert "id" not in json.loads(forbidden["body"])


async def test_malformed_input_gets_json_rpc_errors_never_500() -> None:
    parse = await post(None, raw=b"{not json")
    assert parse["status"] == 400 and json.loads(parse["body"])["error"]["code"] == -32700
    invalid = await post({"jsonrpc": "1.0", "id": 1, "method": "ping"})
    assert json.loads(invalid["body"])["error"]["code"] == -32600
    headers = await initialize()
    unknown = json.loads((await post({"jsonrpc": "2.0", "id": 2, "method": "nope"}, headers))["body"])
    assert unknown["error"]["code"] == -32601
    bad = json.loads((await post({"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"taskId": 5}},
                                 headers))["body"])
    assert bad["error"]["code"] == -32602


async def test_a_whole_reply_declares_its_length_and_a_202_or_204_has_none() -> None:
    """Without Content-Length the server frames a whole reply as chunks (a client learns its
    length only at the end); a reply with no content carries none where HTTP forbids it."""
    response = await post(INIT)
    assert headers_of(response)["content-length"] == str(len(response["body"]))
    headers = await initialize()
    error = await post(None, headers, raw=b"{not json")
    assert error["status"] == 400 and headers_of(error)["content-length"] == str(len(error["body"]))
    accepted = await post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    assert accepted["status"] == 202 and headers_of(accepted)["content-length"] == "0"
    comm = HttpCommunicator(router, "DELETE", "/mcp", headers=headers)
    ended = await comm.get_response(timeout=10)
    assert ended["status"] == 204 and "content-length" not in headers_of(ended)


async def test_only_ping_comes_before_notifications_initialized() -> None:
    response = await post(INIT)
    sid = headers_of(response)["mcp-session-id"]
    headers = [*BASE_HEADERS, (b"mcp-session-id", sid.encode()), (b"mcp-protocol-version", b"2025-11-25")]
    early = await post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers)
    assert early["status"] == 400
    assert json.loads(early["body"])["error"]["code"] == -32600
    assert (await post({"jsonrpc": "2.0", "id": 3, "method": "ping"}, headers))["status"] == 200
    await post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    assert (await post({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, headers))["status"] == 200


async def test_requests_after_initialize_need_a_known_session() -> None:
    missing = await post({"jsonrpc": "2.0", "id": 2, "method": "ping"})
    assert missing["status"] == 400
    unknown = [*BASE_HEADERS, (b"mcp-session-id", b"nope")]
    assert (await post({"jsonrpc": "2.0", "id": 2, "method": "ping"}, unknown))["status"] == 404


async def test_a_creation_on_a_session_ended_by_another_process_is_refused(settings: Any) -> None:
    """A task creation may use the session this process last read live, unread (issue 27): a
    session another process ended since (its DELETE, which this one cannot hear of) still
    gets 404 and no task, as a session read for the request would."""
    from mcptasks.db import async_sql
    from mcptasks.models import McpSession, Task
    from mcptasks.tasks import session_memory
    from tests.support.requirements import require_postgres

    require_postgres()
    async_sql._failed_until = 0.0
    settings.MCPTASKS = {**settings.MCPTASKS, "ASYNC_READS": True}
    headers = await initialize()
    sid = dict(headers)[b"mcp-session-id"].decode()
    create = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
              "params": {"name": "demo_sleep", "arguments": {"ms": 1}, "task": {"ttl": 60_000}}}
    first = await post(create, headers)
    assert first["status"] == 200 and "task" in json.loads(first["body"])["result"]
    assert session_memory._remembered.rows.get(sid) is not None, "the session read for the first creation is remembered"
    ended = await sync_to_async(McpSession.objects.filter(pk=sid).update)(ended_at=timezone.now())
    assert ended == 1
    second = await post({**create, "id": 3}, headers)
    assert second["status"] == 404, second
    assert await sync_to_async(Task.objects.filter(session_id=sid).count)() == 1
    assert session_memory._remembered.rows.get(sid) is None, "a session found gone is forgotten"


async def test_tool_call_streams_progress_then_the_result_with_an_in_loop_worker() -> None:
    headers = await initialize()
    stop = asyncio.Event()
    worker = Worker(concurrency=2, run_cleanup=False)
    runner = asyncio.ensure_future(worker.run(stop))
    try:
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "demo_progress", "arguments": {"steps": 2, "interval_ms": 10},
                           "_meta": {"progressToken": "p1"}}}
        comm = HttpCommunicator(router, "POST", "/mcp", body=json.dumps(body).encode(), headers=headers)
        response = await comm.get_response(timeout=20)
    finally:
        stop.set()
        await asyncio.wait_for(runner, 20)
        # The worker keeps its connection in asgiref's shared sync thread; release it so the
        # test database can be dropped.
        await sync_to_async(lambda: connection.close())()
    assert response["status"] == 200
    assert headers_of(response)["content-type"] == "text/event-stream"
    events = [e for e in iter_sse(iter(response["body"].decode().split("\n"))) if not isinstance(e, str)]
    assert events[0].data == "" and events[0].retry is not None  # the priming event comes first
    messages = [e.message for e in events if e.message]
    for m in messages:
        validate_server_message(m, "tools/call" if "method" not in m else None)
    progress = [m["params"]["progress"] for m in messages if m.get("method") == "notifications/progress"]
    assert progress == [1, 2]
    assert messages[-1]["id"] == 7
    assert messages[-1]["result"]["content"][0]["text"] == "Completed 2 steps"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
methods = st.sampled_from([
    "ping", "tools/list", "tools/call", "tasks/get", "tasks/result", "tasks/list", "tasks/cancel",
    "resources/read", "prompts/get", "completion/complete", "logging/setLevel", "initialize", "nope",
])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    message=st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"jsonrpc": st.just("2.0"), "id": st.one_of(st.integers(0, 10**6), st.text(max_size=8)),
             "method": methods},
            optional={"params": json_values},
        ),
    )
)
def test_arbitrary_json_never_gets_a_500_or_a_non_json_error(message: Any) -> None:
    """Property: whatever JSON arrives, the answer is a well-formed HTTP/JSON-RPC reply."""
    async def run() -> dict[str, Any]:
        headers = await initialize()
        return await post(message, headers, timeout=10)

    response = async_to_sync(run)()
    assert response["status"] in {200, 202, 400, 404, 413, 429}
    body = response["body"]
    if response["status"] == 202:
        assert body == b""
        return
    if headers_of(response).get("content-type") == "text/event-stream":
        return  # a tool call was accepted and is streaming (no worker runs in this test)
    parsed = json.loads(body)
    assert parsed["jsonrpc"] == "2.0"
    assert ("result" in parsed) != ("error" in parsed)
    if "error" in parsed:
        assert isinstance(parsed["error"]["code"], int)
        assert "Traceback" not in parsed["error"]["message"]


async def test_an_event_arriving_early_pulls_the_one_still_in_flight_from_the_store() -> None:
    """Sequence numbers are gap-free per stream: seeing n+2 first, the consumer sends n+1, n+2."""
    from channels.layers import get_channel_layer

    from mcptasks.streams import events, signals

    headers = await initialize()
    sid = dict(headers)[b"mcp-session-id"].decode()
    get_headers = [(k, v) for k, v in headers if k != b"content-type"]
    get_headers = [(k, b"text/event-stream" if k == b"accept" else v) for k, v in get_headers]
    comm = HttpCommunicator(router, "GET", "/mcp", headers=get_headers)
    await comm.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await comm.receive_output(5)
    assert start["type"] == "http.response.start" and start["status"] == 200
    priming = (await comm.receive_output(5))["body"].decode()
    assert priming.startswith("id: ") and "data: " in priming
    stream_id = events.get_stream_id(sid)
    # Two publishers; the first one's push is "still in flight" (never sent here at all).
    append = sync_to_async(events._append)
    first = await append(session_id=sid, stream_id=stream_id, data='{"jsonrpc":"2.0","method":"a"}')
    second = await append(session_id=sid, stream_id=stream_id, data='{"jsonrpc":"2.0","method":"b"}')
    assert second.seq == first.seq + 1
    await get_channel_layer().group_send(
        signals.stream_group(stream_id),
        {"type": "stream.event", "event_id": second.event_id, "seq": second.seq, "data": second.data},
    )
    text = ""
    while '"method":"b"' not in text:
        text += (await comm.receive_output(5))["body"].decode()
    assert text.index(f"id: {first.event_id}") < text.index(f"id: {second.event_id}")
    assert text.count('"method":"a"') == 1 and text.count('"method":"b"') == 1
    await comm.send_input({"type": "http.disconnect"})
    await sync_to_async(lambda: connection.close())()  # asgiref's sync thread used one


async def test_database_outage_is_a_503_with_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 11 item 5: while the database is away the answer is 503 + Retry-After, never 500."""
    from django.db import OperationalError

    from mcptasks.db import async_sql as fastreads
    from mcptasks.tasks import selectors

    headers = await initialize()

    def unavailable(**_: Any) -> Any:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(selectors, "get_task", unavailable)
    # The hop-free reads (PostgreSQL) fail too, then fall back to the (failing) ORM.
    real = fastreads.conninfo
    monkeypatch.setattr(fastreads, "conninfo", lambda: {**real(), "host": "127.0.0.1", "port": 1})
    await fastreads.close()
    response = await post({"jsonrpc": "2.0", "id": 5, "method": "tasks/get", "params": {"taskId": "abc"}}, headers)
    assert response["status"] == 503
    assert headers_of(response)["retry-after"] == "5"
    assert json.loads(response["body"])["error"]["code"] == -32603
    monkeypatch.setattr(selectors, "get_session", unavailable)
    response = await post({"jsonrpc": "2.0", "id": 6, "method": "ping"}, headers)
    assert response["status"] == 503


async def test_no_reconnect_hop_per_message_and_an_outage_in_a_write_is_a_503(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stale connections are closed (and reopened) in the ORM's thread by database_sync_to_async,
    not before every message as Channels does: a ping makes no such hop. A dead database found
    by a write is a 503, not a 500."""
    import channels.consumer
    from django.db import OperationalError

    from mcptasks.tasks import sessions

    headers = await initialize()
    hops: list[int] = []

    async def counted() -> None:
        hops.append(1)

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted)
    assert (await post({"jsonrpc": "2.0", "id": 7, "method": "ping"}, headers))["status"] == 200
    assert hops == []

    def unavailable(**_: Any) -> None:
        raise OperationalError("connection failed: server closed the connection unexpectedly")

    monkeypatch.setattr(sessions, "mark_initialized", unavailable)
    response = await post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    assert response["status"] == 503
    assert headers_of(response)["retry-after"] == "5"


async def test_refusals_reach_the_audit_trail(settings: Any) -> None:
    """A presented bad token and a 429, each answered and audited."""
    from mcptasks.audit import watch
    from mcptasks.models import AuditEvent
    from tenants import services as tenant_services
    from tenants.models import Tenant

    watch.throttle.clear()
    settings.TENANTS = {**settings.TENANTS, "ALLOW_ANONYMOUS": False}
    bad = await post(INIT, [*BASE_HEADERS, (b"authorization", b"Bearer not-a-real-token")])
    assert bad["status"] == 401
    tenant = await sync_to_async(Tenant.objects.create)(slug="limited", rate_other_per_min=1)
    token = await sync_to_async(tenant_services.issue_token)(tenant=tenant, principal_name="c", scopes=["mcp:tools"])
    authed = [*BASE_HEADERS, (b"authorization", f"Bearer {token}".encode())]
    assert (await post(INIT, authed))["status"] == 200
    assert (await post(INIT, authed))["status"] == 429

    def actions() -> dict[str, Any]:
        return {e.action: e for e in AuditEvent.objects.all()}

    events = await sync_to_async(actions)()
    assert events["auth.failed"].data["status"] == 401 and "not-a-real-token" not in json.dumps(
        events["auth.failed"].data)
    assert events["ratelimit.refused"].tenant_id == tenant.pk
    assert events["ratelimit.refused"].data["class"] == "other"


async def test_a_missing_scope_is_refused_and_audited(settings: Any) -> None:
    from mcptasks.audit import watch
    from mcptasks.models import AuditEvent
    from tenants import services as tenant_services
    from tenants.models import Tenant

    watch.throttle.clear()
    settings.TENANTS = {**settings.TENANTS, "ALLOW_ANONYMOUS": False}
    tenant = await sync_to_async(Tenant.objects.create)(slug="scoped")
    token = await sync_to_async(tenant_services.issue_token)(tenant=tenant, principal_name="c", scopes=["mcp:tools"])
    authed = [*BASE_HEADERS, (b"authorization", f"Bearer {token}".encode())]
    init = await post(INIT, authed)
    assert init["status"] == 200
    sid = headers_of(init)["mcp-session-id"]
    session = [*authed, (b"mcp-session-id", sid.encode()), (b"mcp-protocol-version", b"2025-11-25")]
    assert (await post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session))["status"] == 202
    listing = await post({"jsonrpc": "2.0", "id": 2, "method": "tasks/list", "params": {}}, session)
    assert listing["status"] == 403
    event = await sync_to_async(AuditEvent.objects.get)(action="auth.scope_refused")
    assert event.tenant_id == tenant.pk and event.data["scope"] == "mcp:tasks"
    assert event.data["method"] == "tasks/list"


async def test_concurrent_requests_share_one_verification_and_one_limits_read(monkeypatch: Any) -> None:
    """When a token's cached verdict (or a tenant's cached limits) lapses, the requests in flight
    share one database hop instead of each queuing its own on the shared database thread."""
    from mcptasks.endpoint import gate
    from mcptasks.tasks import selectors as task_selectors
    from tenants import services as tenant_services
    from tenants.auth_cache import cache
    from tenants.selectors import clear_limits_cache
    from tests.support.factories import make_tenant

    tenant = await sync_to_async(make_tenant)(rate_other_per_min=1000)
    token = await sync_to_async(tenant_services.issue_token)(
        tenant=tenant, principal_name="herd", scopes=["mcp:tools", "mcp:tasks"]
    )
    headers = [*BASE_HEADERS, (b"authorization", f"Bearer {token}".encode())]
    calls = {"authenticate": 0, "tenant_row": 0}

    def counting(name: str, real: Any) -> Any:
        def wrapped(**kw: Any) -> Any:
            calls[name] += 1
            return real(**kw)
        return wrapped

    monkeypatch.setattr(gate, "authenticate", counting("authenticate", gate.authenticate))
    # The limits are read by the admission pipeline both eras run.
    read_limits = task_selectors.atenant_row

    async def counted_read(**kw: Any) -> Any:
        calls["tenant_row"] += 1
        return await read_limits(**kw)

    monkeypatch.setattr(task_selectors, "atenant_row", counted_read)
    cache.clear()
    clear_limits_cache()
    responses = await asyncio.gather(*(post(INIT, headers) for _ in range(8)))
    assert [r["status"] for r in responses] == [200] * 8
    assert calls == {"authenticate": 1, "tenant_row": 1}
    # A refused credential is refused for every request that shared its verification.
    cache.clear()
    bad = [*BASE_HEADERS, (b"authorization", b"Bearer not-a-token")]
    refused = await asyncio.gather(*(post(INIT, bad) for _ in range(4)))
    assert [r["status"] for r in refused] == [401] * 4
    assert calls["authenticate"] == 2


async def test_a_verdict_is_verified_again_in_the_background_before_it_lapses(
    monkeypatch: Any, settings: Any
) -> None:
    """In the last quarter of a cached verdict's AUTH_CACHE_S, requests go on with it while one
    verification runs (issue 27: once it lapsed, every request in flight with that credential
    waited); a credential revoked meanwhile is refused from the moment that verification ends."""
    import datetime
    import time as _time

    from django.utils import timezone
    from oauth2_provider.models import get_access_token_model

    from mcptasks.endpoint import gate
    from tenants import services as tenant_services
    from tenants.auth_cache import cache
    from tests.support.factories import make_tenant

    settings.TENANTS = {**settings.TENANTS, "AUTH_CACHE_S": 60.0}
    tenant = await sync_to_async(make_tenant)()
    token = await sync_to_async(tenant_services.issue_token)(
        tenant=tenant, principal_name="ahead", scopes=["mcp:tools", "mcp:tasks"]
    )
    headers = [*BASE_HEADERS, (b"authorization", f"Bearer {token}".encode())]
    release, calls = asyncio.Event(), []

    async def held(token: str) -> None:
        # Held on the event loop (a slow identity provider), not on the shared database thread.
        calls.append(1)
        await release.wait()

    cache.clear()
    assert (await post(INIT, headers))["status"] == 200
    monkeypatch.setattr(gate.jwt_issuers, "aprefetch", held)
    [(key, (_, ctx, fingerprint))] = list(cache._entries.items())
    cache._entries[key] = (_time.time() + 10.0, ctx, fingerprint)  # the last quarter of its 60 s
    # Expired by another process (a queryset update sends no signal to clear this one's cache).
    expired = timezone.now() - datetime.timedelta(seconds=1)
    await sync_to_async(get_access_token_model().objects.all().update)(expires=expired)
    try:
        # The verdict still holds: three requests answered while the verification is held.
        responses = await asyncio.wait_for(asyncio.gather(*(post(INIT, headers) for _ in range(3))), 5)
        assert [r["status"] for r in responses] == [200] * 3
        assert len(calls) == 1
    finally:
        release.set()
    for _ in range(200):
        if cache.get(key) is None:
            break
        await asyncio.sleep(0.01)
    assert cache.get(key) is None
    assert (await post(INIT, headers))["status"] == 401


async def test_a_verdict_is_kept_without_a_verification_while_nothing_it_was_decided_from_changed(
    monkeypatch: Any, settings: Any
) -> None:
    """Re-verifying a cached verdict whose inputs are unchanged costs one read on the event loop,
    not an ORM verification on a thread (issue 27, tenants.auth_fingerprint); an edit made by
    another process (no signal clears this one's cache) still ends it at the next re-verification."""
    import time as _time

    from mcptasks.db import async_sql
    from mcptasks.endpoint import gate
    from tenants import services as tenant_services
    from tenants.auth_cache import cache
    from tenants.models import Tenant
    from tests.support.factories import make_tenant
    from tests.support.requirements import require_postgres

    require_postgres()
    async_sql._failed_until = 0.0
    settings.MCPTASKS = {**settings.MCPTASKS, "ASYNC_READS": True}
    settings.TENANTS = {**settings.TENANTS, "AUTH_CACHE_S": 60.0}
    tenant = await sync_to_async(make_tenant)()
    token = await sync_to_async(tenant_services.issue_token)(
        tenant=tenant, principal_name="steady", scopes=["mcp:tools", "mcp:tasks"])
    headers = [*BASE_HEADERS, (b"authorization", f"Bearer {token}".encode())]
    verifications: list[int] = []
    real = gate.authenticate

    def counted(**kw: Any) -> Any:
        verifications.append(1)
        return real(**kw)

    monkeypatch.setattr(gate, "authenticate", counted)

    async def due_then_request() -> int:
        """Put the verdict in the last quarter of its time, send a request, wait for the re-verification."""
        [(key, (_, ctx, fingerprint))] = list(cache._entries.items())
        cache._entries[key] = (_time.time() + 10.0, ctx, fingerprint)
        status = (await post(INIT, headers))["status"]
        for _ in range(300):
            entry = cache._entries.get(key)
            if entry is None or entry[0] > _time.time() + 30:
                break
            await asyncio.sleep(0.01)
        return status

    try:
        cache.clear()
        assert async_sql.available()
        assert (await post(INIT, headers))["status"] == 200
        assert len(verifications) == 1
        # The first re-verification is a full one (a first verification keeps no fingerprint);
        # it keeps the fingerprint for the next ones.
        assert await due_then_request() == 200
        assert len(verifications) == 2
        [(_, (_, _, kept))] = list(cache._entries.items())
        assert kept is not None
        for _ in range(3):
            assert await due_then_request() == 200
        assert len(verifications) == 2  # nothing changed: the verdict was kept without one
        # Disabled by another process: the next re-verification sees the change and refuses.
        await sync_to_async(Tenant.objects.filter(pk=tenant.pk).update)(active=False)
        assert await due_then_request() == 200  # answered with the verdict while it is re-verified
        assert len(verifications) == 3
        assert list(cache._entries.items()) == []
        assert (await post(INIT, headers))["status"] == 401
    finally:
        await async_sql.close()


async def _read_sse_until(comm: HttpCommunicator, done: Any, within_s: float) -> tuple[str, bool]:
    """Read a streaming response's body until ``done(text)`` or its end; (text, whether it ended)."""
    text = ""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not done(text):
        left = deadline - loop.time()
        if left <= 0:
            return text, False
        try:
            out = await comm.receive_output(left)
        except TimeoutError:
            return text, False
        if out["type"] == "http.response.body":
            text += out.get("body", b"").decode()
            if not out.get("more_body", False):
                return text, True
    return text, False


@pytest.fixture
def lose_pushes(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """A short re-check and lifetime, and a call after which every send through the layer is skipped.

    Skipped as while this process's breaker is open (opened by another request's failed send):
    a stream that starts meanwhile joins its groups (joins bypass the breaker) and is not
    degraded (only the streams open when the send failed are told), but every push (the
    worker's signals, stream events) is skipped. The breaker is kept from closing, since a send
    already in flight when it opened closes it when it gets through.
    """
    from mcptasks.streams import layers

    settings.MCPTASKS = {**settings.MCPTASKS, "TASK_RESULT_RECHECK_S": 0.3, "SSE_KEEPALIVE_S": 0.5,
                         "SSE_MAX_STREAM_S": 8.0}
    return lambda: monkeypatch.setattr(layers.send_breaker, "allow", lambda: False)


async def test_a_resumed_tasks_result_stream_gets_the_result_when_its_push_is_lost(
    lose_pushes: Callable[[], None],
) -> None:
    """The soak's resume operation with the result's push lost: it arrives before the lifetime.

    Before the fix the resumed stream published the result, never saw its push, and its periodic
    re-check stopped at "result already published": the stream ended at its lifetime (8 s here,
    300 s by default) without the result.
    """
    headers = await initialize()
    stop = asyncio.Event()
    worker = Worker(concurrency=2, run_cleanup=False)
    runner = asyncio.ensure_future(worker.run(stop))
    try:
        created = await post({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                              "params": {"name": "demo_progress", "arguments": {"steps": 4, "interval_ms": 150},
                                         "task": {}}}, headers)
        task_id = json.loads(created["body"])["result"]["task"]["taskId"]
        body = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tasks/result", "params": {"taskId": task_id}})
        first = HttpCommunicator(router, "POST", "/mcp", body=body.encode(), headers=headers)
        await first.send_input({"type": "http.request", "body": body.encode(), "more_body": False})
        start = await first.receive_output(5)
        assert start["status"] == 200
        text, _ended = await _read_sse_until(first, lambda t: "notifications/tasks/status" in t, 10)
        assert "notifications/tasks/status" in text and '"id":3' not in text, text
        # Drop the connection after the first status notification, as the soak's client does.
        last_id = [line[4:] for line in text.splitlines() if line.startswith("id: ")][-1]
        await first.send_input({"type": "http.disconnect"})
        lose_pushes()  # from here on, while the task runs to its end

        get_headers = [(k, b"text/event-stream" if k == b"accept" else v) for k, v in headers if k != b"content-type"]
        resumed = HttpCommunicator(router, "GET", "/mcp", headers=[*get_headers, (b"last-event-id", last_id.encode())])
        await resumed.send_input({"type": "http.request", "body": b"", "more_body": False})
        start = await resumed.receive_output(5)
        assert start["status"] == 200
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        text, ended = await _read_sse_until(resumed, lambda t: '"id":3' in t, 15)
        took = loop.time() - t0
    finally:
        stop.set()
        await asyncio.wait_for(runner, 20)
        await sync_to_async(lambda: connection.close())()
    messages = [e.message for e in iter_sse(iter(text.split("\n"))) if not isinstance(e, str) and e.message]
    results = [m for m in messages if m.get("id") == 3]
    assert results, f"the resumed stream ended={ended} after {took:.1f} s without the result: {text!r}"
    assert results[0]["result"]["content"][0]["text"] == "Completed 4 steps"
    assert not ended  # the result closes the stream, not its lifetime


async def test_the_recheck_of_a_tasks_result_stream_sends_stored_events_whose_push_was_lost(
    lose_pushes: Callable[[], None],
) -> None:
    """An event another process stored for a waiting tasks/result stream, its push lost, still arrives.

    Before the fix the backstop re-check only re-read the task, never the stream's stored events:
    a lost push (a worker's progress notification, an input request) waited for the lifetime.
    """
    from mcptasks.streams import events

    headers = await initialize()
    sid = dict(headers)[b"mcp-session-id"].decode()
    created = await post({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                          "params": {"name": "demo_sleep", "arguments": {"ms": 5000}, "task": {}}}, headers)
    task_id = json.loads(created["body"])["result"]["task"]["taskId"]
    body = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tasks/result", "params": {"taskId": task_id}})
    comm = HttpCommunicator(router, "POST", "/mcp", body=body.encode(), headers=headers)
    try:
        await comm.send_input({"type": "http.request", "body": body.encode(), "more_body": False})
        start = await comm.receive_output(5)
        assert start["status"] == 200
        priming, _ = await _read_sse_until(comm, lambda t: "id: " in t and "\n\n" in t, 5)
        event_id = [line[4:] for line in priming.splitlines() if line.startswith("id: ")][0]
        parsed = events.parse_event_id(event_id)
        assert parsed is not None
        stream_id = parsed[0]
        lose_pushes()
        # Stored by "another process", its push never sent (no worker runs: the task stays working).
        note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "lost"}}
        data = json.dumps(note, separators=(",", ":"))
        await sync_to_async(events._append)(session_id=sid, stream_id=stream_id, data=data)
        text, ended = await _read_sse_until(comm, lambda t: '"data":"lost"' in t, 3)
        assert '"data":"lost"' in text, f"not sent within 3 s (ended={ended}): {text!r}"
        assert not ended  # still waiting for the result
    finally:
        await comm.send_input({"type": "http.disconnect"})
        await sync_to_async(lambda: connection.close())()


async def test_a_resumed_tasks_result_stream_keeps_its_binding_when_the_dropped_connection_ends_late(
    settings: Any,
) -> None:
    """The dropped connection's late end must not leave the resumed stream without input requests.

    Both connections serve the same stream id. Before the fix the dropped one, ending after the
    resumption had bound the stream again, unbound it (its "only if still ours" matched the
    shared id): the task's input requests and status notifications then went to the session's
    GET stream, and the resumed stream waited for its lifetime.
    """
    from mcptasks.models import Task
    from mcptasks.tasks import messages

    settings.MCPTASKS = {**settings.MCPTASKS, "TASK_RESULT_RECHECK_S": 0.3}
    headers = await initialize()
    created = await post({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                          "params": {"name": "demo_sleep", "arguments": {"ms": 5000}, "task": {}}}, headers)
    task_id = json.loads(created["body"])["result"]["task"]["taskId"]
    body = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tasks/result", "params": {"taskId": task_id}})
    first = HttpCommunicator(router, "POST", "/mcp", body=body.encode(), headers=headers)
    get_headers = [(k, b"text/event-stream" if k == b"accept" else v) for k, v in headers if k != b"content-type"]
    resumed: HttpCommunicator | None = None
    try:
        await first.send_input({"type": "http.request", "body": body.encode(), "more_body": False})
        assert (await first.receive_output(5))["status"] == 200
        priming, _ = await _read_sse_until(first, lambda t: "id: " in t and "\n\n" in t, 5)
        event_id = [line[4:] for line in priming.splitlines() if line.startswith("id: ")][0]
        resumed = HttpCommunicator(router, "GET", "/mcp", headers=[*get_headers, (b"last-event-id", event_id.encode())])
        await resumed.send_input({"type": "http.request", "body": b"", "more_body": False})
        assert (await resumed.receive_output(5))["status"] == 200
        await _read_sse_until(resumed, lambda t: "\n\n" in t, 5)  # its priming event: bound again by now
        await first.send_input({"type": "http.disconnect"})  # the dropped connection ends only now
        await first.wait(5)
        task = await sync_to_async(Task.objects.get)(task_id=task_id)
        # A tool asks the client something (no worker runs here: queued as a worker would).
        await sync_to_async(messages.add_task_message)(
            task=task, method="elicitation/create",
            params={"message": "name?", "requestedSchema": {"type": "object", "properties": {}}},
        )
        text, ended = await _read_sse_until(resumed, lambda t: "elicitation/create" in t, 3)
        assert "elicitation/create" in text, f"not sent on the resumed stream within 3 s (ended={ended}): {text!r}"
        bound = await sync_to_async(lambda: Task.objects.get(task_id=task_id).stream_id)()
        assert bound == bus_stream_of(event_id)
    finally:
        await first.send_input({"type": "http.disconnect"})
        if resumed is not None:
            await resumed.send_input({"type": "http.disconnect"})
        await sync_to_async(lambda: connection.close())()


def bus_stream_of(event_id: str) -> str:
    """The stream id of an SSE event id."""
    from mcptasks.streams import events

    parsed = events.parse_event_id(event_id)
    assert parsed is not None
    return parsed[0]
