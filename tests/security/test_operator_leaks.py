"""Smaller leaks (issue 25 item 12).

A plain call refused by quota gets its -32010 error; tenant-scoped operators never see worker
hosts and pids; CSV exports carry no formula cells; audit-API reads and exports are audited
(throttled, across processes) and its rate limit holds across processes; the API's schema and
docs need a signed-in operator.
"""

from __future__ import annotations

import base64
import csv
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import channel_layers
from channels.testing import HttpCommunicator
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client
from django.urls import reverse

from mcptasks.asgi import router
from mcptasks.audit import watch
from mcptasks.models import AuditEvent, Task
from tenants import kv
from tenants import services as tenant_services
from tenants.models import Principal
from tests.support.client import iter_sse
from tests.support.factories import make_auth, make_task, make_tenant
from tests.support.requirements import require_postgres, require_redis

WORKER_ID = "build-host-17.internal-4242-a1b2c3"
FORMULAS = ["=HYPERLINK(\"http://evil.example/\",\"x\")", "+1+1", "-2+3", "@SUM(A1)", "\t=1+1", "\r=1+1"]


@pytest.fixture(autouse=True)
def _services(settings: Any) -> Iterator[None]:
    require_postgres()
    require_redis()
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    watch.throttle.clear()
    # Like Django's test client: a request must not close the test's (transaction's) connection.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def _basic(username: str) -> dict[str, str]:
    token = base64.b64encode(f"{username}:pw-{username}".encode()).decode()
    return {"HTTP_AUTHORIZATION": "Basic " + token}


def _operator(username: str, tenant: Any, role: str) -> Any:
    user = get_user_model().objects.create_user(username=username, password="pw-" + username)
    tenant_services.grant_operator_role(user=user, tenant=tenant, role=role)
    return user


def _signed_in(user: Any) -> Client:
    c = Client(enforce_csrf_checks=True)
    c.force_login(user)
    return c


def _csv(response: Any) -> list[list[str]]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(body)))


# --- a plain call refused by quota -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_plain_call_refused_by_quota_gets_its_error_not_an_empty_stream(settings: Any) -> None:
    from asgiref.sync import sync_to_async

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends = {}
    tenant = await sync_to_async(make_tenant)(max_concurrent_tasks=0)
    token = await sync_to_async(tenant_services.issue_token)(tenant=tenant, principal_name="c")
    base = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
            (b"accept", b"application/json, text/event-stream"), (b"authorization", f"Bearer {token}".encode())]

    async def post(body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
        comm = HttpCommunicator(router, "POST", "/mcp", body=json.dumps(body).encode(), headers=headers)
        return await comm.get_response(timeout=5)  # type: ignore[no-any-return]

    init = await post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}, base)
    sid = dict(init["headers"])[b"mcp-session-id"]
    headers = [*base, (b"mcp-session-id", sid), (b"mcp-protocol-version", b"2025-11-25")]
    await post({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    response = await post({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                           "params": {"name": "demo_sleep", "arguments": {"ms": 1}}}, headers)
    events = [e for e in iter_sse(iter(response["body"].decode().split("\n"))) if not isinstance(e, str) and e.data]
    assert [json.loads(e.data)["error"]["code"] for e in events] == [-32010]
    assert json.loads(events[0].data)["id"] == 9
    channel_layers.backends = {}


# --- worker hosts and pids ---------------------------------------------------------------------


@pytest.mark.django_db
def test_tenant_scoped_operators_never_see_worker_hosts_or_pids() -> None:
    tenant = make_tenant("acme")
    task = make_task(make_auth(tenant))
    Task.objects.filter(pk=task.pk).update(worker_id=WORKER_ID)
    for role in ("admin", "auditor"):
        user = _operator(f"scoped-{role}", tenant, role)
        c = _signed_in(user)
        listing = c.get(reverse("admin:mcptasks_task_changelist"))
        page = c.get(reverse("admin:mcptasks_task_change", args=[task.pk]))
        assert listing.status_code == page.status_code == 200
        assert task.task_id in listing.content.decode()
        api = c.get(f"/api/tenants/acme/tasks/{task.task_id}/")
        export = c.get("/api/tenants/acme/tasks/", {"format": "csv"})
        listed = c.get("/api/tenants/acme/tasks/")
        for text in (listing.content.decode(), page.content.decode(), api.content.decode(),
                     json.dumps(_csv(export)), listed.content.decode()):
            assert "build-host-17" not in text and "4242" not in text
        assert api.json()["worker_id"].startswith("worker-")
    everyone = get_user_model().objects.create_superuser(username="root", password="pw", email="")
    root = _signed_in(everyone)
    assert WORKER_ID in root.get(reverse("admin:mcptasks_task_changelist")).content.decode()
    assert root.get(f"/api/tenants/acme/tasks/{task.task_id}/").json()["worker_id"] == WORKER_ID


# --- CSV formula cells ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_csv_exports_escape_formula_cells() -> None:
    tenant = make_tenant("acme")
    for n, formula in enumerate(FORMULAS):
        # Principal names and identifiers come from OAuth clients and identity providers.
        auth = make_auth(tenant, identifier=formula)
        Principal.objects.filter(pk=auth.principal_id).update(name="" if n % 2 else formula)
        make_task(auth)
    user = _operator("aud", tenant, "auditor")
    c = _signed_in(user)
    admin_rows = _csv(c.get(reverse("admin:mcptasks_auditevent_csv")))
    api_events = _csv(c.get("/api/tenants/acme/audit-events/", {"format": "csv"}))
    api_tasks = _csv(c.get("/api/tenants/acme/tasks/", {"format": "csv"}))
    for rows in (admin_rows, api_events, api_tasks):
        cells = [cell for row in rows[1:] for cell in row]
        assert len(rows) > len(FORMULAS)
        assert not [cell for cell in cells if cell[:1] in ("=", "+", "-", "@", "\t", "\r")]
    # The API's exports go through the same cells.
    from mcptasks.console import operators

    assert operators.csv_row([*FORMULAS, "plain", 7]) == [*("'" + f for f in FORMULAS), "plain", 7]
    # The admin's export names principals as text: the cells are still there, escaped.
    escaped = [c for row in admin_rows[1:] for c in row if c[:1] == "'" and c[1:2] in ("=", "+", "-", "@", "\t", "\r")]
    assert len(escaped) >= 3
    # The principal's name is a column of its own (principal.name), escaped like any cell.
    principal_column = api_tasks[0].index("principal.name")
    names = [row[principal_column] for row in api_tasks[1:]]
    assert {name[1:] for name in names} == set(FORMULAS) and all(name.startswith("'") for name in names)


# --- audit-API reads, its throttle, schema and docs ----------------------------------------------


@pytest.mark.django_db
def test_audit_api_reads_and_exports_are_audited_throttled_across_processes(settings: Any) -> None:
    # One (fixed) window for the whole test: an hour's boundary is unlikely to fall inside it.
    settings.MCPTASKS = {**settings.MCPTASKS, "AUDIT_REFUSAL_EVERY_S": 3600.0}
    tenant, other = make_tenant("acme"), make_tenant("globex")
    make_task(make_auth(tenant))
    _operator("aud", tenant, "auditor")
    c = Client()
    for _ in range(3):
        assert c.get("/api/tenants/acme/audit-events/", {"action": "task.create"}, **_basic("aud")).status_code == 200
        watch.throttle.forget_local()  # as if the next request reached another process
    assert c.get("/api/tenants/acme/tasks/", {"format": "csv"}, **_basic("aud")).status_code == 200
    reads = AuditEvent.objects.filter(action="api.read", tenant=tenant)
    exports = AuditEvent.objects.filter(action="api.export", tenant=tenant)
    assert reads.count() == 1 and exports.count() == 1
    assert reads[0].data["operator"] == "aud" and reads[0].data["query"] == {"action": "task.create"}
    assert exports[0].data["resource"] == "tasks"
    # A tenant the operator may not see: 404, and nothing in that tenant's chain.
    assert c.get("/api/tenants/globex/tasks/", **_basic("aud")).status_code == 404
    assert not AuditEvent.objects.filter(tenant=other, action__startswith="api.").exists()


@pytest.mark.django_db
def test_the_api_rate_limit_holds_across_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    from rest_framework.settings import api_settings

    throttle_class = api_settings.DEFAULT_THROTTLE_CLASSES[0]
    monkeypatch.setattr(throttle_class, "THROTTLE_RATES", {**throttle_class.THROTTLE_RATES, "user": "3/day"})
    tenant = make_tenant("acme")
    _operator("aud", tenant, "auditor")
    c = Client()
    statuses = []
    for _ in range(4):
        statuses.append(c.get("/api/tenants/acme/tasks/", **_basic("aud")).status_code)
        cache.clear()  # another process has none of this one's cache
        kv.local.clear()
    assert statuses == [200, 200, 200, 429]


@pytest.mark.django_db
def test_api_schema_and_docs_need_a_signed_in_operator() -> None:
    tenant = make_tenant("acme")
    for path in ("/api/schema/", "/api/docs/"):
        assert Client().get(path).status_code in (401, 403)
        get_user_model().objects.filter(username="nobody").delete()
        get_user_model().objects.create_user(username="nobody", password="pw-nobody")
        assert Client().get(path, **_basic("nobody")).status_code == 403
    _operator("aud", tenant, "auditor")
    assert Client().get("/api/schema/", **_basic("aud")).status_code == 200
    assert Client().get("/api/docs/", **_basic("aud")).status_code == 200
