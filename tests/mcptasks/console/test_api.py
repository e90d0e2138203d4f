"""The audit-review REST API: scoping by role, filters, pagination, CSV, and schemathesis over its schema."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings

from mcptasks.audit import watch
from mcptasks.models import AuditEvent
from tenants import kv
from tenants import services as tenant_services
from tests.support.factories import make_auth, make_task, make_tenant

pytestmark = pytest.mark.django_db


def _basic(username: str, password: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()}


@pytest.fixture(autouse=True)
def _fresh_read_throttle() -> Iterator[None]:
    """``api.read`` is audited once per operator and window; operator ids repeat across tests on
    SQLite (its ids roll back with the test), so each test starts with an empty throttle."""
    watch.throttle.clear()
    kv.local.clear()
    yield
    watch.throttle.clear()


@pytest.fixture
def no_connection_closing() -> Iterator[None]:
    """Like Django's test client: a request must not close the test's (transaction's) connection."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def world(settings: Any, no_connection_closing: None) -> dict[str, Any]:
    # Basic auth checks the password on every request: a fast hasher keeps generated runs quick.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    a, b = make_tenant("acme"), make_tenant("globex")
    auth_a, auth_b = make_auth(a), make_auth(b)
    tasks_a = [make_task(auth_a) for _ in range(3)]
    make_task(auth_b)
    user = get_user_model().objects.create_user(username="aud", password="secret-pw")
    tenant_services.grant_operator_role(user=user, tenant=a, role="auditor")
    return {"a": a, "b": b, "tasks_a": tasks_a, "creds": _basic("aud", "secret-pw")}


def test_an_auditor_reads_their_tenant_and_another_tenant_is_a_missing_one(world: dict[str, Any]) -> None:
    c = Client()
    events = c.get("/api/tenants/acme/audit-events/", **world["creds"])
    assert events.status_code == 200
    body = events.json()
    assert {e["tenant"] for e in body["results"]} == {"acme"}
    assert [e["id"] for e in body["results"]] == sorted((e["id"] for e in body["results"]), reverse=True)
    other = c.get("/api/tenants/globex/audit-events/", **world["creds"])
    missing = c.get("/api/tenants/no-such-tenant/audit-events/", **world["creds"])
    assert other.status_code == missing.status_code == 404
    assert other.json() == missing.json()
    assert c.get("/api/tenants/globex/tasks/", **world["creds"]).status_code == 404
    assert c.get("/api/tenants/acme/tasks/").status_code in (401, 403)
    assert c.get("/api/tenants/acme/tasks/", **_basic("aud", "wrong")).status_code in (401, 403)


def test_tasks_are_filtered_paginated_and_never_carry_arguments(world: dict[str, Any]) -> None:
    c = Client()
    page = c.get("/api/tenants/acme/tasks/", {"page_size": 2}, **world["creds"]).json()
    assert len(page["results"]) == 2 and page["next"]
    rest = c.get(page["next"], **world["creds"]).json()
    seen = [t["task_id"] for t in page["results"] + rest["results"]]
    assert sorted(seen) == sorted(t.task_id for t in world["tasks_a"])
    assert "params" not in page["results"][0] and "result" not in page["results"][0]
    one = world["tasks_a"][0]
    detail = c.get(f"/api/tenants/acme/tasks/{one.task_id}/", **world["creds"]).json()
    assert detail["task_id"] == one.task_id and detail["status"] == "working"
    assert c.get("/api/tenants/acme/tasks/", {"status": "completed"}, **world["creds"]).json()["results"] == []
    assert c.get("/api/tenants/acme/tasks/", {"status": "bogus"}, **world["creds"]).status_code == 400
    assert c.get("/api/tenants/acme/tasks/", {"since": "yesterday"}, **world["creds"]).status_code == 400
    # Found by schemathesis: an offset PostgreSQL refuses (Python accepts up to 24 h) was a 500.
    odd = c.get("/api/tenants/acme/audit-events/", {"since": "0255-12-17T11:32:08+19:11"}, **world["creds"])
    assert odd.status_code == 200
    assert c.get("/api/tenants/acme/audit-events/", {"until": "0001-01-01T00:00:00+01:00"},
                 **world["creds"]).status_code == 400


def test_audit_events_export_as_csv_with_filters(world: dict[str, Any]) -> None:
    response = Client().get("/api/tenants/acme/audit-events/", {"format": "csv", "action": "task.create"},
                            **world["creds"])
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))  # type: ignore[attr-defined]
    assert rows[0][0] == "id" and len(rows) == 4
    assert {r[rows[0].index("action")] for r in rows[1:]} == {"task.create"}
    assert AuditEvent.objects.filter(tenant=world["a"], action="task.create").count() == 3


def test_schema_and_docs_are_served_with_local_assets(world: dict[str, Any]) -> None:
    schema = Client().get("/api/schema/", **world["creds"])
    assert schema.status_code == 200 and b"/api/tenants/{tenant_slug}/audit-events/" in schema.content
    docs = Client().get("/api/docs/", **world["creds"]).content.decode()
    assert "swagger-ui" in docs and "cdn" not in docs.lower() and "/static/drf_spectacular_sidecar/" in docs


# --- CSV: one column per field ------------------------------------------------------------


def _csv_rows(response: Any) -> list[list[str]]:
    return list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))  # type: ignore[attr-defined]


def test_csv_export_has_a_column_per_data_key_not_json_in_a_cell(world: dict[str, Any]) -> None:
    ev = AuditEvent.objects.create(tenant=world["a"], action="probe.csv",
                                   data={"tool": "=cmd|' /C calc'!A0", "ms": 12, "nested": {"a": [1]}})
    AuditEvent.objects.create(tenant=world["a"], action="probe.csv", data={"other": "x"})
    AuditEvent.objects.create(tenant=world["b"], action="probe.csv", data={"globex_only": "secret"})
    response = Client().get("/api/tenants/acme/audit-events/", {"format": "csv", "action": "probe.csv"},
                            **world["creds"])
    rows = _csv_rows(response)
    header = rows[0]
    assert "data" not in header and "principal" not in header
    assert {"data.tool", "data.ms", "data.nested", "data.other", "principal.id", "principal.name"} <= set(header)
    # Another tenant's keys never become columns of this tenant's export.
    assert "data.globex_only" not in header
    by_id = {r[header.index("id")]: dict(zip(header, r, strict=True)) for r in rows[1:]}
    row = by_id[str(ev.pk)]
    assert row["data.tool"] == "'=cmd|' /C calc'!A0"  # formula escaping kept
    assert row["data.ms"] == "12" and json.loads(row["data.nested"]) == {"a": [1]} and row["data.other"] == ""
    # The admin's export has the same columns for the data keys.
    root = get_user_model().objects.create_superuser(username="root-csv", password="pw", email="")
    c = Client()
    c.force_login(root)
    admin_rows = _csv_rows(c.get("/admin/mcptasks/auditevent/export.csv", {"action__exact": "probe.csv",
                                                                        "tenant__id__exact": world["a"].pk}))
    assert {"data.tool", "data.ms", "data.other"} <= set(admin_rows[0]) and "data" not in admin_rows[0]
    assert "data.globex_only" not in admin_rows[0]
    admin_row = dict(zip(admin_rows[0], next(r for r in admin_rows[1:] if r[0] == str(ev.pk)), strict=True))
    assert admin_row["data.tool"] == "'=cmd|' /C calc'!A0"


def test_task_csv_splits_the_principal_into_columns(world: dict[str, Any]) -> None:
    rows = _csv_rows(Client().get("/api/tenants/acme/tasks/", {"format": "csv"}, **world["creds"]))
    assert rows[0][:5] == ["task_id", "tenant", "principal.id", "principal.name", "tool_name"]
    assert len(rows) == 4 and all(r[2].isdigit() for r in rows[1:])


# --- OAuth tokens with the audit:read scope -------------------------------------------------


def _cc_token(link: Any, secret: str, scope: str) -> str:
    response = Client().post("/o/token/", {"grant_type": "client_credentials", "client_id": link.application.client_id,
                                           "client_secret": secret, "scope": scope})
    assert response.status_code == 200, response.content
    return str(response.json()["access_token"])


def _bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.fixture
def auditor_app(world: dict[str, Any]) -> dict[str, Any]:
    auditor = get_user_model().objects.get(username="aud")
    link, secret = tenant_services.create_client_application(
        tenant=world["a"], principal_name="audit-bot", scopes=["audit:read", "mcp:tools"], owner=auditor)
    return {"link": link, "secret": secret, "user": auditor}


def test_client_credentials_token_with_audit_scope_reads_its_tenant_only(world: dict[str, Any],
                                                                         auditor_app: dict[str, Any]) -> None:
    token = _cc_token(auditor_app["link"], auditor_app["secret"], "audit:read")
    c = Client()
    events = c.get("/api/tenants/acme/audit-events/", **_bearer(token))
    assert events.status_code == 200 and {e["tenant"] for e in events.json()["results"]} == {"acme"}
    assert c.get("/api/tenants/acme/tasks/", {"format": "csv"}, **_bearer(token)).status_code == 200
    other = c.get("/api/tenants/globex/audit-events/", **_bearer(token))
    missing = c.get("/api/tenants/nope/audit-events/", **_bearer(token))
    assert other.status_code == missing.status_code == 404 and other.json() == missing.json()
    # The read is recorded in the tenant's chain under the operator who owns the application.
    read = AuditEvent.objects.filter(tenant=world["a"], action="api.read", data__operator="aud").first()
    assert read is not None and read.data["client_id"] == auditor_app["link"].application.client_id
    assert token not in json.dumps(read.data)


def test_a_token_without_the_scope_is_refused(world: dict[str, Any], auditor_app: dict[str, Any]) -> None:
    token = _cc_token(auditor_app["link"], auditor_app["secret"], "mcp:tools")
    c = Client()
    assert c.get("/api/tenants/acme/audit-events/", **_bearer(token)).status_code == 403
    assert c.get("/api/tenants/acme/tasks/", **_bearer(token)).status_code == 403
    assert c.get("/api/schema/", **_bearer(token)).status_code == 403
    # Narrowing the application's grant applies to a token already issued.
    scoped = _cc_token(auditor_app["link"], auditor_app["secret"], "audit:read")
    assert c.get("/api/tenants/acme/tasks/", **_bearer(scoped)).status_code == 200
    link = auditor_app["link"]
    link.allowed_scopes = "mcp:tools"
    link.save()
    assert c.get("/api/tenants/acme/tasks/", **_bearer(scoped)).status_code == 403
    # Unknown and garbage tokens are not a server error.
    assert c.get("/api/tenants/acme/tasks/", **_bearer("no-such-token")).status_code == 401
    assert c.get("/api/tenants/acme/tasks/", HTTP_AUTHORIZATION="Bearer \u00e9\u00e9").status_code in (401, 403)


def test_a_token_of_an_operator_without_the_role_reads_nothing(world: dict[str, Any]) -> None:
    member = get_user_model().objects.create_user(username="plain", password="pw-plain")
    tenant_services.add_member(tenant=world["a"], user=member)
    link, secret = tenant_services.create_client_application(
        tenant=world["a"], principal_name="not-an-auditor", scopes=["audit:read"], owner=member)
    token = _cc_token(link, secret, "audit:read")
    assert Client().get("/api/tenants/acme/audit-events/", **_bearer(token)).status_code == 404
    # An application of another tenant owned by acme's auditor is a token for globex, not acme.
    other_link, other_secret = tenant_services.create_client_application(
        tenant=world["b"], principal_name="cross", scopes=["audit:read"],
        owner=get_user_model().objects.get(username="aud"))
    cross = _cc_token(other_link, other_secret, "audit:read")
    assert Client().get("/api/tenants/acme/audit-events/", **_bearer(cross)).status_code == 404
    assert Client().get("/api/tenants/globex/audit-events/", **_bearer(cross)).status_code == 404
    # An application nobody owns acts for no operator.
    orphan, orphan_secret = tenant_services.create_client_application(
        tenant=world["a"], principal_name="orphan", scopes=["audit:read"])
    assert Client().get("/api/tenants/acme/tasks/", **_bearer(_cc_token(orphan, orphan_secret,
                                                                          "audit:read"))).status_code == 401


def test_an_all_tenant_auditors_token_still_reads_only_its_applications_tenant(world: dict[str, Any]) -> None:
    everyone = get_user_model().objects.create_user(username="global", password="pw-global")
    tenant_services.grant_operator_role(user=everyone, tenant=None, role="auditor")
    link, secret = tenant_services.create_client_application(
        tenant=world["a"], principal_name="global-bot", scopes=["audit:read"], owner=everyone)
    token = _cc_token(link, secret, "audit:read")
    assert Client().get("/api/tenants/acme/tasks/", **_bearer(token)).status_code == 200
    assert Client().get("/api/tenants/globex/tasks/", **_bearer(token)).status_code == 404
    # Basic credentials of the same operator see every tenant.
    assert Client().get("/api/tenants/globex/tasks/", **_basic("global", "pw-global")).status_code == 200


def test_authorization_code_token_of_an_auditor(world: dict[str, Any]) -> None:
    auditor = get_user_model().objects.get(username="aud")
    tenant_services.add_member(tenant=world["a"], user=auditor, scopes=["audit:read"])
    tenant_services.grant_operator_role(user=auditor, tenant=world["a"], role="auditor")
    redirect = "http://127.0.0.1:33418/callback"
    link, _ = tenant_services.create_authorization_code_application(
        tenant=world["a"], name="audit-ui", redirect_uris=[redirect], scopes=["audit:read"])
    verifier = "v" * 64
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    browser = Client()
    browser.force_login(auditor)
    answer = browser.post("/o/authorize/", {
        "response_type": "code", "client_id": link.application.client_id, "redirect_uri": redirect,
        "scope": "audit:read", "code_challenge": challenge, "code_challenge_method": "S256", "state": "s",
        "allow": "Authorize"})
    assert answer.status_code == 302, answer.content[:300]
    code = parse_qs(urlsplit(answer["Location"]).query)["code"][0]
    issued = Client().post("/o/token/", {"grant_type": "authorization_code", "client_id": link.application.client_id,
                                         "code": code, "redirect_uri": redirect, "code_verifier": verifier})
    assert issued.status_code == 200, issued.content
    token = issued.json()["access_token"]
    assert Client().get("/api/tenants/acme/audit-events/", **_bearer(token)).status_code == 200
    # The membership's grant is checked now: narrowing it refuses the token already issued.
    tenant_services.add_member(tenant=world["a"], user=auditor, scopes=["mcp:tools"])
    assert Client().get("/api/tenants/acme/audit-events/", **_bearer(token)).status_code == 403


def test_the_schema_describes_every_accepted_scheme(world: dict[str, Any]) -> None:
    schema = Client().get("/api/schema/", {"format": "json"}, **world["creds"]).json()
    schemes = schema["components"]["securitySchemes"]
    assert schemes["basicAuth"]["scheme"] == "basic"
    assert schemes["cookieAuth"]["type"] == "apiKey"
    oauth = schemes["oauth2"]
    assert oauth["type"] == "oauth2"
    assert oauth["flows"]["clientCredentials"]["scopes"] == {"audit:read": "Read the tenant's audit events and tasks"}
    assert "authorizationCode" in oauth["flows"]
    operation = schema["paths"]["/api/tenants/{tenant_slug}/audit-events/"]["get"]
    assert {"oauth2": ["audit:read"]} in operation["security"] and {"basicAuth": []} in operation["security"]


# --- schemathesis: every operation, generated inputs, no server error ----------------------

def _operator_schema() -> Any:
    """The schema an operator downloads from /api/schema/ (anonymous callers get 401/403 there),
    exercised against the WSGI application."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer

    document = json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True)))
    loaded = schemathesis.openapi.from_dict(document)
    loaded.app = get_wsgi_application()
    return loaded


api_schema = _operator_schema()
#: One test per operation, each with an id of its own ("GET /api/..."): schemathesis's own
#: ``@api_schema.parametrize()`` gave all of them one id, and pytest-xdist then ran only one
#: (tests/support/unique_ids.py now refuses such a collection).
OPERATIONS = [result.ok() for result in api_schema.get_all_operations()]


def test_every_operation_of_the_schema_is_exercised() -> None:
    assert len(OPERATIONS) >= 8
    assert all(op.label.startswith("GET /api/tenants/{tenant_slug}/") for op in OPERATIONS)


@pytest.mark.slow(reason="schemathesis: 30 generated requests per operation, ~15 s")
@pytest.mark.parametrize("operation", OPERATIONS, ids=[op.label for op in OPERATIONS])
def test_the_api_never_answers_with_a_server_error(operation: Any, world: dict[str, Any]) -> None:
    @given(case=operation.as_strategy())
    @hsettings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    def check(case: Any) -> None:
        if "tenant_slug" in (case.path_parameters or {}):
            # Half the cases ask for the auditor's tenant, half for whatever was generated.
            if hash(str(case.path_parameters)) % 2 == 0:
                case.path_parameters["tenant_slug"] = "acme"
        response = case.call(headers={"Authorization": world["creds"]["HTTP_AUTHORIZATION"]})
        assert response.status_code < 500, response.text[:500]
        if case.path_parameters and case.path_parameters.get("tenant_slug") == "globex":
            assert response.status_code == 404

    check()


def test_webhook_endpoints_and_deliveries_are_listed_without_secrets_or_payloads(world: dict[str, Any]) -> None:
    from mcptasks.models import TaskStatus
    from mcptasks.tasks import transitions
    from tenants.services import add_webhook_endpoint

    mine = add_webhook_endpoint(tenant=world["a"], url="https://a.example.com/h", events=["task.completed"])
    theirs = add_webhook_endpoint(tenant=world["b"], url="https://b.example.com/h", events=["task.completed"])
    task = world["tasks_a"][0]
    transitions.transition(task=task, to=TaskStatus.COMPLETED, result={"content": [{"type": "text", "text": "s3cr"}]})
    c = Client()
    endpoints = c.get("/api/tenants/acme/webhook-endpoints/", **world["creds"])
    assert endpoints.status_code == 200
    assert [e["url"] for e in endpoints.json()["results"]] == [mine.url]
    assert mine.secret not in endpoints.content.decode() and "secret\"" not in endpoints.content.decode()
    deliveries = c.get("/api/tenants/acme/webhook-deliveries/?state=pending", **world["creds"])
    [row] = deliveries.json()["results"]
    assert row["task_id"] == task.task_id and row["event"] == "task.completed" and row["state"] == "pending"
    assert "s3cr" not in deliveries.content.decode()
    assert c.get("/api/tenants/globex/webhook-endpoints/", **world["creds"]).status_code == 404
    assert c.get(f"/api/tenants/acme/webhook-endpoints/{theirs.pk}/", **world["creds"]).status_code == 404
    assert c.get("/api/tenants/acme/webhook-deliveries/?state=bogus", **world["creds"]).status_code == 400
