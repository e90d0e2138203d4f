"""The operator console: static files, health, roles, the admin (scoped, audited, no secrets), dashboard, metrics."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from mcptasks.models import AuditEvent, Task
from tenants import services as tenant_services
from tenants.models import ExternalIssuer, Principal, Tenant
from tests.support.factories import make_auth, make_task, make_tenant

pytestmark = pytest.mark.django_db


def _user(username: str, **kw: Any) -> Any:
    return get_user_model().objects.create_user(username=username, password="pw-" + username, **kw)


def _login(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


@pytest.fixture
def root() -> Client:
    return _login(get_user_model().objects.create_superuser(username="root", password="pw", email=""))


@pytest.fixture
def two_tenants() -> dict[str, Any]:
    a, b = make_tenant("acme"), make_tenant("globex")
    auth_a, auth_b = make_auth(a), make_auth(b)
    Principal.objects.filter(pk=auth_a.principal_id).update(name="Acme build bot")
    return {"a": a, "b": b, "auth_a": auth_a, "auth_b": auth_b,
            "task_a": make_task(auth_a), "task_b": make_task(auth_b)}


# --- static files and health -------------------------------------------------------------


def test_admin_static_files_are_served_without_collectstatic() -> None:
    response = Client().get("/static/admin/css/base.css")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/css")
    body = b"".join(response.streaming_content)  # type: ignore[attr-defined]
    assert b"--primary" in body  # the admin's real stylesheet, not an error page
    chart = Client().get("/static/mcptasks/vendor/chartjs/chart.umd.min.js")
    assert chart.status_code == 200


def test_healthz_is_liveness_and_readyz_checks_database_and_layer() -> None:
    assert Client().get("/healthz").json() == {"status": "ok"}
    ready = Client().get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "database": True, "channel_layer": True, "degraded": []}


def test_readyz_is_503_when_the_database_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    from mcptasks.console import views

    monkeypatch.setattr(views, "_database_ok", lambda: False)
    ready = Client().get("/readyz")
    assert ready.status_code == 503 and ready.json()["database"] is False


# --- roles and scoping -------------------------------------------------------------------


def test_a_tenant_admin_sees_and_cancels_only_their_tenants_tasks(two_tenants: dict[str, Any]) -> None:
    admin_user = _user("alice")
    tenant_services.grant_operator_role(user=admin_user, tenant=two_tenants["a"], role="admin")
    c = _login(admin_user)
    listing = c.get(reverse("admin:mcptasks_task_changelist"))
    assert listing.status_code == 200
    page = listing.content.decode()
    assert two_tenants["task_a"].task_id in page
    assert two_tenants["task_b"].task_id not in page
    assert "globex" not in page  # not even in the tenant filter
    # Another tenant's task is a missing one, page and action alike.
    other = reverse("admin:mcptasks_task_change", args=[two_tenants["task_b"].pk])
    assert c.get(other).status_code == 404  # exactly like a missing task
    for task in (two_tenants["task_a"], two_tenants["task_b"]):
        c.post(reverse("admin:mcptasks_task_changelist"),
               {"action": "cancel_tasks", "_selected_action": [task.pk]})
    assert Task.objects.get(pk=two_tenants["task_a"].pk).status == "cancelled"
    assert Task.objects.get(pk=two_tenants["task_b"].pk).status == "working"
    cancel = AuditEvent.objects.get(action="admin.cancel")
    assert cancel.tenant_id == two_tenants["a"].pk and cancel.data["operator"] == "alice"
    assert AuditEvent.objects.filter(action="task.cancelled", task_id=two_tenants["task_a"].task_id).exists()


def test_an_auditor_reads_but_cannot_change_or_cancel(two_tenants: dict[str, Any]) -> None:
    auditor = _user("audrey")
    tenant_services.grant_operator_role(user=auditor, tenant=two_tenants["a"], role="auditor")
    c = _login(auditor)
    assert c.get(reverse("admin:mcptasks_auditevent_changelist")).status_code == 200
    listing = c.get(reverse("admin:mcptasks_task_changelist")).content.decode()
    assert "cancel_tasks" not in listing  # no cancel action offered
    c.post(reverse("admin:mcptasks_task_changelist"),
           {"action": "cancel_tasks", "_selected_action": [two_tenants["task_a"].pk]})
    assert Task.objects.get(pk=two_tenants["task_a"].pk).status == "working"
    response = c.post(reverse("admin:tenants_tenant_change", args=[two_tenants["a"].pk]),
                      {"slug": "renamed"})
    assert response.status_code == 403
    assert Tenant.objects.get(pk=two_tenants["a"].pk).slug == "acme"


def test_an_all_tenants_auditor_sees_every_tenant(two_tenants: dict[str, Any]) -> None:
    out = io.StringIO()
    call_command("mcptasks_tenant", "operator", "olga", "--role", "auditor", "--all-tenants", stdout=out)
    assert "created user olga with password" in out.getvalue()
    page = _login(get_user_model().objects.get(username="olga")).get(
        reverse("admin:mcptasks_task_changelist")).content.decode()
    assert two_tenants["task_a"].task_id in page and two_tenants["task_b"].task_id in page


# --- admin lists -------------------------------------------------------------------------


def test_task_list_is_newest_first_searchable_and_names_principals(root: Client, two_tenants: dict[str, Any]) -> None:
    newest = make_task(two_tenants["auth_a"])
    page = root.get(reverse("admin:mcptasks_task_changelist")).content.decode()
    assert page.index(newest.task_id) < page.index(two_tenants["task_a"].task_id)
    assert "Acme build bot (acme)" in page
    found = root.get(reverse("admin:mcptasks_task_changelist"), {"q": two_tenants["task_b"].task_id}).content.decode()
    assert two_tenants["task_b"].task_id in found and two_tenants["task_a"].task_id not in found
    by_name = root.get(reverse("admin:mcptasks_task_changelist"), {"q": "build bot"}).content.decode()
    assert two_tenants["task_a"].task_id in by_name and two_tenants["task_b"].task_id not in by_name


def test_audit_events_cannot_be_deleted_or_edited_and_export_as_csv(root: Client,
                                                                     two_tenants: dict[str, Any]) -> None:
    ev = AuditEvent.objects.filter(tenant=two_tenants["a"]).first()
    assert ev is not None
    assert root.get(reverse("admin:mcptasks_auditevent_delete", args=[ev.pk])).status_code == 403
    assert root.post(reverse("admin:mcptasks_auditevent_change", args=[ev.pk]), {"action": "x"}).status_code == 403
    listing = root.get(reverse("admin:mcptasks_auditevent_changelist")).content.decode()
    assert "delete_selected" not in listing and "Export CSV" in listing
    export = root.get(reverse("admin:mcptasks_auditevent_csv"), {"tenant__id__exact": two_tenants["a"].pk})
    rows = list(csv.reader(io.StringIO(b"".join(export.streaming_content).decode())))  # type: ignore[attr-defined]
    assert rows[0][:5] == ["id", "created_at", "tenant", "principal", "action"]
    assert rows[1:] and {r[2] for r in rows[1:]} == {"acme"}
    assert AuditEvent.objects.filter(pk=ev.pk).exists()


def test_workers_show_alive_or_dead(root: Client) -> None:
    import datetime as dt

    from django.utils import timezone

    from mcptasks.worker import rows

    rows.worker_heartbeat(worker_id="w-alive", hostname="h", pid=1, concurrency=4, running=0)
    rows.worker_heartbeat(worker_id="w-dead", hostname="h", pid=2, concurrency=4, running=0)
    from mcptasks.models import WorkerHeartbeat

    WorkerHeartbeat.objects.filter(worker_id="w-dead").update(last_seen_at=timezone.now() - dt.timedelta(hours=1))
    page = root.get(reverse("admin:mcptasks_workerheartbeat_changelist")).content.decode()
    row_alive = page[page.index("w-alive"):][:600]
    row_dead = page[page.index("w-dead"):][:600]
    assert ">alive<" in row_alive and ">dead<" in row_dead


# --- admin changes are audited; secrets never shown ---------------------------------------


def test_admin_changes_are_audited_with_before_and_after(root: Client, two_tenants: dict[str, Any]) -> None:
    url = reverse("admin:tenants_tenant_change", args=[two_tenants["a"].pk])
    data = {"slug": "acme", "name": "", "active": "on", "rate_read_per_min": "120",
            **{f"{p}-{k}": v for p in ("principals", "memberships", "applications", "external_issuers")
               for k, v in (("TOTAL_FORMS", "0"), ("INITIAL_FORMS", "0"), ("MIN_NUM_FORMS", "0"),
                            ("MAX_NUM_FORMS", "1000"))}}
    response = root.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]
    ev = AuditEvent.objects.get(action="admin.change")
    assert ev.tenant_id == two_tenants["a"].pk and ev.data["operator"] == "root"
    assert ev.data["changes"]["rate_read_per_min"] == {"before": None, "after": 120}


def test_no_admin_page_shows_a_secret_and_secret_edits_are_audited_blind(root: Client) -> None:
    tenant = make_tenant("secretive")
    _link, client_secret = tenant_services.create_client_application(tenant=tenant, principal_name="bot")
    token = tenant_services.issue_token(tenant=tenant, principal_name="cli", scopes=["mcp:tasks"])
    issuer = ExternalIssuer.objects.create(tenant=tenant, issuer="https://idp.example", shared_secret="hs-secret-1234",
                                           algorithms="HS256")
    response = root.post(reverse("admin:tenants_externalissuer_change", args=[issuer.pk]), {
        "tenant": tenant.pk, "name": "", "active": "on", "issuer": "https://idp.example", "jwks_url": "",
        "static_keys": "null", "shared_secret": "hs-secret-5678", "audience": "", "tenant_claim": "",
        "tenant_claim_value": "", "principal_claim": "sub", "scopes_claim": "scope", "algorithms": "HS256",
        "leeway_s": "30",
    })
    assert response.status_code == 302, response.content.decode()[:3000]
    secrets = [client_secret, token, "hs-secret-1234", "hs-secret-5678"]
    from django.contrib import admin

    pages = 0
    for model in admin.site._registry:
        info = (model._meta.app_label, model._meta.model_name)
        urls = [reverse("admin:{}_{}_changelist".format(*info))]
        for obj in model._default_manager.all()[:5]:
            urls.append(reverse("admin:{}_{}_change".format(*info), args=[obj.pk]))
        for url in urls:
            body = root.get(url).content.decode()
            pages += 1
            for secret in secrets:
                assert secret not in body, f"{url} shows a secret"
    assert pages > 15
    ev = AuditEvent.objects.get(action="admin.change", data__model="tenants.externalissuer")
    assert ev.data["changes"]["shared_secret"] == "(secret changed)"
    assert all(s not in json.dumps(list(AuditEvent.objects.values_list("data", flat=True))) for s in secrets)


# --- dashboard and metrics -----------------------------------------------------------------


def test_dashboard_shows_a_tenants_figures_to_its_operators_only(root: Client, two_tenants: dict[str, Any]) -> None:
    from mcptasks.tasks import transitions

    transitions.transition(task=two_tenants["task_a"], to="completed", result={"content": []})
    page = root.get(reverse("dashboard"), {"tenant": "acme"})
    assert page.status_code == 200
    data = page.context["chart_data"]
    assert sum(data["tasksByStatus"]["completed"]) == 1 and sum(data["tasksByStatus"]["working"]) == 0
    assert [d["tool"] for d in data["durations"]] == ["demo_sleep"]
    assert 'id="dashboard-data"' in page.content.decode() and "chart.umd.min.js" in page.content.decode()
    # A tenant admin of globex gets only globex in the picker and in the figures.
    bob = _user("bob")
    tenant_services.grant_operator_role(user=bob, tenant=two_tenants["b"], role="admin")
    mine = _login(bob).get(reverse("dashboard"), {"tenant": "acme"})  # asks for someone else's tenant
    assert [t.slug for t in mine.context["tenants"]] == ["globex"]
    assert sum(mine.context["chart_data"]["tasksByStatus"]["completed"]) == 0
    assert sum(mine.context["chart_data"]["tasksByStatus"]["working"]) == 1
    assert _login(_user("nobody", is_staff=True)).get(reverse("dashboard")).status_code == 403


def test_metrics_report_tasks_queue_workers_and_refusals(two_tenants: dict[str, Any], settings: Any) -> None:
    from mcptasks.observability.metrics import REFUSALS

    settings.MCPTASKS = {**settings.MCPTASKS, "METRICS_TOKEN": "scrape-token"}
    REFUSALS.labels("ratelimit.refused").inc()
    body = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token").content.decode()
    assert 'mcptasks_tasks{status="working",tenant="acme"} 1.0' in body
    assert "mcptasks_queue_depth 2.0" in body
    assert "mcptasks_workers_alive" in body
    assert 'mcptasks_refusals_total{kind="ratelimit.refused"}' in body


def test_serve_prints_a_working_operator_login(tmp_path: Any, settings: Any) -> None:
    from mcptasks.processes.devserver import DevServer

    settings.VAR_DIR = tmp_path
    server = DevServer(host="127.0.0.1", port=8765)
    username, password = server.operator_login()
    assert username == "operator" and password
    assert Client().login(username=username, password=password)
    assert get_user_model().objects.get(username="operator").is_superuser
    assert server.operator_login() == (username, password)  # same login on the next start
    assert oct((tmp_path / "dev-operator.json").stat().st_mode & 0o777) == "0o600"
    user = get_user_model().objects.get(username="operator")
    user.set_password("changed-by-someone")
    user.save()
    assert server.operator_login() == ("operator", None)
    assert any("/admin/" in line for line in server.banner())


def test_inline_edits_and_other_apps_admin_changes_are_audited(root: Client, two_tenants: dict[str, Any]) -> None:
    user = _user("member-1")
    tenant_services.add_member(tenant=two_tenants["a"], user=user)
    membership = user.tenant_memberships.get()
    url = reverse("admin:tenants_tenant_change", args=[two_tenants["a"].pk])
    counts = {"principals": 1, "memberships": 1}
    data: dict[str, Any] = {"slug": "acme", "name": "", "active": "on"}
    for prefix in ("principals", "memberships", "applications", "external_issuers"):
        n = counts.get(prefix, 0)
        data.update({f"{prefix}-TOTAL_FORMS": str(n), f"{prefix}-INITIAL_FORMS": str(n),
                     f"{prefix}-MIN_NUM_FORMS": "0", f"{prefix}-MAX_NUM_FORMS": "1000"})
    principal = Principal.objects.get(tenant=two_tenants["a"])
    data.update({"principals-0-id": str(principal.pk), "principals-0-tenant": str(two_tenants["a"].pk),
                 "principals-0-kind": principal.kind, "principals-0-identifier": principal.identifier,
                 "principals-0-name": principal.name,
                 "memberships-0-id": str(membership.pk), "memberships-0-tenant": str(two_tenants["a"].pk),
                 "memberships-0-user": str(user.pk), "memberships-0-role": "auditor",
                 "memberships-0-allowed_scopes": membership.allowed_scopes})
    response = root.post(url, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    ev = AuditEvent.objects.get(action="admin.change", data__model="tenants.tenantmembership")
    assert ev.tenant_id == two_tenants["a"].pk
    assert ev.data["changes"]["role"] == {"before": "member", "after": "auditor"}
    # A user made superuser through Django's own user admin is audited too.
    target = _user("mallory")
    response = root.post(reverse("admin:auth_user_change", args=[target.pk]), {
        "username": "mallory", "password": target.password, "is_active": "on", "is_staff": "on",
        "is_superuser": "on", "last_login_0": "", "last_login_1": "", "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00", "initial-date_joined_0": "2026-01-01", "initial-date_joined_1": "00:00:00"})
    assert response.status_code == 302, response.content.decode()[:3000]
    user_ev = AuditEvent.objects.get(action="admin.change", data__model="auth.user")
    assert user_ev.data["operator"] == "root" and "Superuser status" in user_ev.data["change_message"]


# --- the task page ------------------------------------------------------------------------


def _csrf_client(user: Any) -> Client:
    c = Client(enforce_csrf_checks=True)
    c.force_login(user)
    return c


def _csrf(page: str) -> str:
    import re

    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert match, "no CSRF token on the page"
    return match.group(1)


def _running(task: Task, **extra: Any) -> Task:
    from django.utils import timezone

    from mcptasks.models import TaskMessage

    now = timezone.now()
    Task.objects.filter(pk=task.pk).update(
        params={"name": task.tool_name, "arguments": {"ms": 1, "note": "<script>alert(1)</script>"}},
        status_message="step 3 of 10", progress={"progress": 3, "total": 10, "message": "copying"},
        worker_id="host-a.example:4242:abcd", attempt=1, started_at=now, **extra)
    TaskMessage.objects.create(task=task, rpc_id=f"rpc-{task.pk}", method="elicitation/create",
                               params={"message": "Which bucket?"}, response={"action": "accept",
                                                                              "content": {"answer": "b-42"}},
                               answered_at=now)
    return Task.objects.get(pk=task.pk)


def test_task_page_shows_the_task_and_another_tenants_task_is_a_404(two_tenants: dict[str, Any]) -> None:
    task = _running(two_tenants["task_a"])
    _running(two_tenants["task_b"])
    alice = _user("alice-page")
    tenant_services.grant_operator_role(user=alice, tenant=two_tenants["a"], role="admin")
    c = _csrf_client(alice)
    response = c.get(reverse("admin:mcptasks_task_change", args=[task.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert "step 3 of 10" in page and "3 / 10" in page and "copying" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page  # escaped
    assert "Which bucket?" in page and "b-42" in page and "elicitation/create" in page
    assert 'id="task-cancel"' in page and "Queued" in page and " s</td>" in page
    # A tenant-scoped operator sees an opaque worker label, never the host and pid.
    assert "host-a.example" not in page and "worker-" in page
    live = c.get(reverse("admin:mcptasks_task_live", args=[task.pk])).json()
    assert live["status"] == "working" and live["percent"] == 30.0 and live["status_message"] == "step 3 of 10"
    assert live["worker"].startswith("worker-") and live["durations"]["running"] is not None
    # Another tenant's task is exactly a missing one, for every URL of the page.
    other = two_tenants["task_b"]
    for name in ("admin:mcptasks_task_change", "admin:mcptasks_task_live"):
        assert c.get(reverse(name, args=[other.pk])).status_code == 404
        assert c.get(reverse(name, args=[999_999_999])).status_code == 404
    assert c.get(reverse("admin:mcptasks_task_download", args=[other.pk, "arguments"])).status_code == 404
    forged = c.post(reverse("admin:mcptasks_task_cancel", args=[other.pk]),
                    {"csrfmiddlewaretoken": _csrf(page)})
    assert forged.status_code == 404
    assert Task.objects.get(pk=other.pk).status == "working"


def test_task_page_cancel_button_is_audited_and_needs_csrf_and_the_role(two_tenants: dict[str, Any]) -> None:
    task = _running(two_tenants["task_a"])
    alice = _user("alice-cancel")
    tenant_services.grant_operator_role(user=alice, tenant=two_tenants["a"], role="admin")
    c = _csrf_client(alice)
    page = c.get(reverse("admin:mcptasks_task_change", args=[task.pk])).content.decode()
    url = reverse("admin:mcptasks_task_cancel", args=[task.pk])
    assert c.post(url).status_code == 403  # no CSRF token
    assert c.get(url).status_code == 405
    assert Task.objects.get(pk=task.pk).status == "working"
    auditor = _user("audrey-page")
    tenant_services.grant_operator_role(user=auditor, tenant=two_tenants["a"], role="auditor")
    ac = _csrf_client(auditor)
    auditor_page = ac.get(reverse("admin:mcptasks_task_change", args=[task.pk])).content.decode()
    assert 'id="task-cancel"' not in auditor_page
    assert ac.post(url, {"csrfmiddlewaretoken": _csrf(auditor_page)}).status_code == 403
    assert Task.objects.get(pk=task.pk).status == "working"
    done = c.post(url, {"csrfmiddlewaretoken": _csrf(page)})
    assert done.status_code == 302 and done["Location"] == reverse("admin:mcptasks_task_change", args=[task.pk])
    assert Task.objects.get(pk=task.pk).status == "cancelled"
    event = AuditEvent.objects.get(action="admin.cancel", task_id=task.task_id)
    assert event.data["operator"] == "alice-cancel"
    after = c.get(done["Location"]).content.decode()
    assert "cancelled" in after and 'id="task-cancel"' not in after and 'data-terminal="1"' in after


def test_task_page_caps_large_results_with_a_download_and_shows_workers_to_all_tenant_operators(
        root: Client, two_tenants: dict[str, Any]) -> None:
    from django.utils import timezone

    from mcptasks.console import taskpage

    big = {"content": [{"type": "text", "text": "x" * (taskpage.INLINE_CHARS + 500)}], "isError": False}
    task = _running(two_tenants["task_a"], status="completed", result=big, finished_at=timezone.now())
    page = root.get(reverse("admin:mcptasks_task_change", args=[task.pk])).content.decode()
    download = reverse("admin:mcptasks_task_download", args=[task.pk, "result"])
    assert download in page and "x" * (taskpage.INLINE_CHARS + 500) not in page
    assert "host-a.example:4242:abcd" in page  # an all-tenant operator sees the worker id
    assert 'data-terminal="1"' in page and 'id="task-cancel"' not in page
    full = root.get(download)
    assert full.status_code == 200 and full["Content-Disposition"].startswith("attachment")
    assert json.loads(full.content) == big
    assert root.get(reverse("admin:mcptasks_task_download", args=[task.pk, "params"])).status_code == 404
    assert root.get(reverse("admin:mcptasks_task_live", args=[task.pk])).json()["worker"] == "host-a.example:4242:abcd"


def test_task_list_shows_status_message_and_duration(root: Client, two_tenants: dict[str, Any]) -> None:
    _running(two_tenants["task_a"])
    listing = root.get(reverse("admin:mcptasks_task_changelist")).content.decode()
    assert "step 3 of 10" in listing and "column-duration" in listing and "column-message" in listing
