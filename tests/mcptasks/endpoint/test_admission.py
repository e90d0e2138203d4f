"""The one admission pipeline (mcptasks.endpoint.admission) both eras run, and the one error table.

Driven in-process through the real consumer (Channels' HttpCommunicator), with PostgreSQL and
Redis: the 2026-07-28 era now counts rate limits on the same async path as the session-based
one (a ``tasks/get`` polled sooner than ``pollInterval`` costs an extra read) and flags fast
polling; before the pipeline it counted through the sync path and flagged nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import channel_layers
from channels.testing import HttpCommunicator

from mcptasks.asgi import router
from mcptasks.endpoint import admission, errors
from mcptasks.methods import era2026 as era_handlers
from mcptasks.methods.era2025 import dispatcher as session_dispatcher
from mcptasks.models import AuditEvent
from mcptasks.protocol import jsonrpc
from mcptasks.protocol.era2026 import TASKS_EXTENSION, RequestMeta
from mcptasks.protocol.errors import (
    HEADER_MISMATCH,
    METHOD_NOT_FOUND,
    MISSING_CLIENT_CAPABILITY,
    RATE_LIMITED,
    UNSUPPORTED_PROTOCOL_VERSION,
    McpError,
)
from tenants import ratelimit
from tenants import services as tenant_services
from tenants.context import AuthContext
from tests.support.factories import make_tenant

pytestmark = [pytest.mark.django_db(transaction=True)]

V2026, V2025 = "2026-07-28", "2025-11-25"
TASKS_CAPS = {"extensions": {TASKS_EXTENSION: {}}}
BASE = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream")]


@pytest.fixture(autouse=True)
def in_memory_layer(settings: Any) -> Iterator[None]:
    settings.MCPTASKS = {**settings.MCPTASKS, "WATCH_FAST_POLLS": 3}
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends = {}
    yield
    channel_layers.backends = {}


class Caller:
    """One principal of a fresh tenant, speaking either era over the real consumer."""

    def __init__(self, token: str, era: str) -> None:
        self.token, self.era, self.session_id = token, era, ""
        self.rid = 0

    async def post(self, method: str, params: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        self.rid += 1
        params = dict(params or {})
        headers = [*BASE, (b"authorization", f"Bearer {self.token}".encode())]
        if self.era == V2026:
            params["_meta"] = {"io.modelcontextprotocol/protocolVersion": V2026,
                               "io.modelcontextprotocol/clientCapabilities": TASKS_CAPS}
            headers += [(b"mcp-protocol-version", V2026.encode()), (b"mcp-method", method.encode())]
            if "taskId" in params:
                headers.append((b"mcp-name", params["taskId"].encode()))
            elif method == "tools/call":
                headers.append((b"mcp-name", params["name"].encode()))
        elif self.session_id:
            headers += [(b"mcp-session-id", self.session_id.encode()), (b"mcp-protocol-version", V2025.encode())]
        body = {"jsonrpc": "2.0", "id": self.rid, "method": method, "params": params}
        response = await HttpCommunicator(router, "POST", "/mcp", body=json.dumps(body).encode(),
                                          headers=headers).get_response(timeout=20)
        if method == "initialize":
            self.session_id = dict(response["headers"])[b"mcp-session-id"].decode()
        return response["status"], json.loads(response["body"]) if response["body"] else {}

    async def open(self) -> None:
        """A 2025-11-25 session (initialize + notifications/initialized); nothing in 2026-07-28."""
        if self.era != V2025:
            return
        await self.post("initialize", {"protocolVersion": V2025, "capabilities": {},
                                       "clientInfo": {"name": "t", "version": "1"}})
        headers = [*BASE, (b"authorization", f"Bearer {self.token}".encode()),
                   (b"mcp-session-id", self.session_id.encode()), (b"mcp-protocol-version", V2025.encode())]
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await HttpCommunicator(router, "POST", "/mcp", body=json.dumps(note).encode(), headers=headers).get_response()

    async def create_task(self) -> str:
        params: dict[str, Any] = {"name": "demo_sleep", "arguments": {"ms": 600_000}}
        if self.era == V2025:
            params["task"] = {}
        status, created = await self.post("tools/call", params)
        assert status == 200, created
        result = created["result"]
        return str(result["taskId"] if "taskId" in result else result["task"]["taskId"])


async def _caller(era: str, **limits: Any) -> tuple[Caller, Any]:
    tenant = await sync_to_async(make_tenant)(**limits)
    token = await sync_to_async(tenant_services.issue_token)(
        tenant=tenant, principal_name="poller", scopes=["mcp:tools", "mcp:tasks"]
    )
    caller = Caller(token, era)
    await caller.open()
    return caller, tenant


@pytest.mark.parametrize("era", [V2025, V2026])
async def test_polling_faster_than_poll_interval_costs_an_extra_read_in_both_eras(era: str) -> None:
    caller, _tenant = await _caller(era, rate_read_per_min=6, poll_interval_ms=60_000)
    task_id = await caller.create_task()  # a creation: not a read
    # Six reads a minute, but every poll after the first comes too soon and costs two:
    # 1, then 1+1, then 1+1 = 5 spent; the fourth poll's extra read is over the budget.
    for i in range(3):
        status, got = await caller.post("tasks/get", {"taskId": task_id})
        assert status == 200 and "result" in got, (i, got)
    status, refused = await caller.post("tasks/get", {"taskId": task_id})
    assert status == 429, refused
    assert refused["id"] == caller.rid
    assert refused["error"]["code"] == RATE_LIMITED
    assert refused["error"]["data"]["limit"] == 6 and refused["error"]["data"]["opClass"] == "read"
    refusal = await sync_to_async(AuditEvent.objects.filter(action="ratelimit.refused").first)()
    assert refusal is not None and refusal.data["method"] == "tasks/get"


@pytest.mark.parametrize("era", [V2025, V2026])
async def test_fast_polling_is_flagged_in_both_eras(era: str) -> None:
    caller, tenant = await _caller(era, rate_read_per_min=10_000, poll_interval_ms=60_000)
    task_id = await caller.create_task()
    for _ in range(4):  # the first poll is on time, the next three too soon: WATCH_FAST_POLLS
        status, _got = await caller.post("tasks/get", {"taskId": task_id})
        assert status == 200
    flag = await sync_to_async(AuditEvent.objects.filter(action="flag.fast_polling", tenant_id=tenant.pk).first)()
    assert flag is not None and flag.data["count"] == 3


async def test_both_eras_are_admitted_by_the_one_pipeline_on_the_async_path(monkeypatch: Any) -> None:
    tables: list[Any] = []
    real = admission.admit

    async def spy(**kw: Any) -> Any:
        tables.append(kw["table"])
        return await real(**kw)

    def sync_path(**kw: Any) -> None:
        raise AssertionError("a request was counted through the sync path")

    monkeypatch.setattr(admission, "admit", spy)
    monkeypatch.setattr(ratelimit, "check_rate", sync_path)
    old, _ = await _caller(V2025, rate_other_per_min=100)
    new, _ = await _caller(V2026, rate_other_per_min=100)
    tables.clear()  # the session's initialize
    assert (await old.post("tools/list"))[0] == 200
    assert (await new.post("tools/list"))[0] == 200
    assert tables == [session_dispatcher, era_handlers.dispatcher]


# --- the method tables' admission rules ---------------------------------------------------------


def _era_ctx(capabilities: dict[str, Any]) -> era_handlers.EraContext:
    auth = AuthContext(tenant_id=1, tenant_slug="t", principal_id=1, principal_name="p",
                       scopes=frozenset({"mcp:tools"}))
    meta = RequestMeta.model_validate({"io.modelcontextprotocol/protocolVersion": V2026,
                                       "io.modelcontextprotocol/clientCapabilities": capabilities})
    return era_handlers.EraContext(auth=auth, meta=meta, request_id=1)


def test_the_2026_routes_decide_scope_and_rate_class_from_the_servers_decision() -> None:
    call = era_handlers.dispatcher.route("tools/call")
    listen = era_handlers.dispatcher.route("subscriptions/listen")
    get = era_handlers.dispatcher.route("tasks/get")
    assert call is not None and listen is not None and get is not None
    params = {"name": "demo_sleep", "arguments": {"ms": 1}}
    assert call.admission_rules(_era_ctx(TASKS_CAPS), params) == ("mcp:tasks", "create")  # becomes a task
    assert call.admission_rules(_era_ctx({}), params) == ("mcp:tools", "other")  # a plain call
    # A requestState that is not the caller's valid one continues nothing: the plain rules.
    assert call.admission_rules(_era_ctx(TASKS_CAPS), {**params, "requestState": "forged"}) == ("mcp:tools",
                                                                                                 "other")
    assert listen.admission_rules(_era_ctx(TASKS_CAPS), {"notifications": {"taskIds": ["a"]}}) == ("mcp:tasks",
                                                                                                   "read")
    assert listen.admission_rules(_era_ctx(TASKS_CAPS), {"notifications": {}}) == ("mcp:tools", "read")
    assert get.admission_rules(_era_ctx(TASKS_CAPS), {"taskId": "x"}) == ("mcp:tasks", "read")


def test_only_tasks_get_polls_and_only_a_well_formed_task_id_is_noted() -> None:
    for table in (session_dispatcher, era_handlers.dispatcher):
        assert [m for m in table.methods if table.route(m).poll] == ["tasks/get"]  # type: ignore[union-attr]
        get = table.route("tasks/get")
        assert admission.polled_task_id(get, {"taskId": "abc-123"}) == "abc-123"
        assert admission.polled_task_id(get, {"taskId": "x" * 500}) is None  # never an unbounded key part
        assert admission.polled_task_id(get, {"taskId": 7}) is None
        assert admission.polled_task_id(table.route("tasks/cancel"), {"taskId": "abc-123"}) is None


# --- the one error table ------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "status_2026"), [
    (HEADER_MISMATCH, 400), (MISSING_CLIENT_CAPABILITY, 400), (UNSUPPORTED_PROTOCOL_VERSION, 400),
    (METHOD_NOT_FOUND, 404), (-32602, 200),
])
def test_the_one_table_answers_each_era(code: int, status_2026: int) -> None:
    err = McpError(code, "x")
    assert errors.answer(err, era=errors.ERA_2026) == (err, status_2026, {})
    assert errors.answer(err) == (err, 200, {})  # the session-based era carries every McpError in a 200


def test_one_payload_too_large_body() -> None:
    body = json.loads(jsonrpc.payload_too_large_body(1024))
    message = "Payload Too Large: the limit is 1024 bytes"
    assert body == {"jsonrpc": "2.0", "error": {"code": -32600, "message": message}}


def test_a_tenant_row_is_re_read_in_the_background_before_it_lapses(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the last quarter of a tenant's cached limits, requests go on with them while one
    re-read runs (issue 27: once they lapsed, every request of the tenant in flight waited for
    the one that re-read them)."""
    import asyncio
    import threading
    import time

    from mcptasks.tasks import selectors as task_selectors
    from tenants import selectors
    from tenants.models import Tenant
    from tests.support.factories import make_auth

    settings.TENANTS = {**settings.TENANTS, "LIMITS_CACHE_S": 60.0}
    auth = make_auth(make_tenant(rate_other_per_min=1000))
    selectors.clear_limits_cache()
    due = selectors.TenantRow(rate_other_per_min=1000)
    selectors.remember_tenant_row(tenant_id=auth.tenant_id, row=due, read_at=time.monotonic() - 50.0)
    release, reads = threading.Event(), []
    real = task_selectors.atenant_row

    async def slow_read(*, tenant_id: int) -> selectors.TenantRow:
        reads.append(tenant_id)
        await asyncio.to_thread(release.wait, 10)
        return await real(tenant_id=tenant_id)

    monkeypatch.setattr(task_selectors, "atenant_row", slow_read)
    edit = sync_to_async(lambda: Tenant.objects.filter(pk=auth.tenant_id).update(rate_other_per_min=5))

    async def main() -> None:
        await edit()
        # Three requests while the re-read is held: none waits for it, one read is made.
        for _ in range(3):
            await asyncio.wait_for(admission._count(auth=auth, op_class="other", polled=None), 2)
        assert reads == [auth.tenant_id]
        assert selectors.usable_tenant_row(tenant_id=auth.tenant_id) == (due, True)
        release.set()
        for _ in range(200):
            hit = selectors.usable_tenant_row(tenant_id=auth.tenant_id)
            if hit is not None and not hit[1]:
                break
            await asyncio.sleep(0.01)
        assert selectors.usable_tenant_row(tenant_id=auth.tenant_id) == (
            selectors.TenantRow(rate_other_per_min=5), False)

    try:
        asyncio.run(main())
    finally:
        release.set()
