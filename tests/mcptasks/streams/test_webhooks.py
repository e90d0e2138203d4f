"""Webhooks: the transactional outbox, claiming in order, signed delivery, the outbound policy."""

from __future__ import annotations

import datetime as dt
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from mcptasks.models import AuditEvent, Outcome, Task, TaskStatus, WebhookDelivery
from mcptasks.streams import webhooks
from mcptasks.tasks import cleanup, messages, transitions, webhook_outbox
from tenants.auth import AuthContext
from tenants.models import Principal, Tenant, WebhookEndpoint
from tenants.services import add_webhook_endpoint, rotate_webhook_secret
from tests.support.factories import make_auth, make_task
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db

ALL_EVENTS = ["task.input_required", "task.completed", "task.failed", "task.cancelled", "task.working"]


@pytest.fixture(autouse=True)
def _loopback_allowed(settings: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "OUTBOUND_ALLOWED_NETWORKS": ("127.0.0.0/8",)}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(secret="").start()
    yield r
    r.stop()


def _endpoint(auth: AuthContext, url: str = "https://hooks.example.com/h", *, principal: bool = False,
              events: list[str] | None = None) -> WebhookEndpoint:
    tenant = Tenant.objects.get(pk=auth.tenant_id)
    who = Principal.objects.get(pk=auth.principal_id) if principal else None
    return add_webhook_endpoint(tenant=tenant, url=url, principal=who, events=events or ALL_EVENTS)


def test_committed_transition_has_its_delivery_and_a_rolled_back_one_has_none(auth: AuthContext) -> None:
    ep = _endpoint(auth)
    task = make_task(auth)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert transitions.transition(task=task, to=TaskStatus.COMPLETED, result={"content": []})
        raise RuntimeError("the surrounding transaction fails")
    assert not WebhookDelivery.objects.exists()
    task = Task.objects.get(pk=task.pk)
    assert task.status == TaskStatus.WORKING
    assert transitions.transition(task=task, to=TaskStatus.COMPLETED,
                                  result={"content": [{"type": "text", "text": "x"}]})
    row = WebhookDelivery.objects.get()
    assert (row.endpoint_id, row.task_id, row.event) == (ep.pk, task.task_id, "task.completed")
    assert row.payload["type"] == "task.completed"
    assert row.payload["tenant"] == auth.tenant_slug
    # The body is the 2026-07-28 tasks/get of the task.
    assert row.payload["data"]["taskId"] == task.task_id
    assert row.payload["data"]["status"] == "completed"
    assert row.payload["data"]["result"]["content"] == [{"type": "text", "text": "x"}]
    assert "ttlMs" in row.payload["data"]


def test_batched_outcomes_write_their_deliveries_in_the_same_transaction(auth: AuthContext) -> None:
    _endpoint(auth)
    tasks = [make_task(auth) for _ in range(3)]
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(attempt=1, worker_id="w")
    for t in tasks:
        t.attempt = 1
    runs = [(t, Outcome(pk=t.pk, attempt=1, status=TaskStatus.FAILED, message="boom",
                        error={"code": -32603, "message": "boom"})) for t in tasks]
    with pytest.raises(RuntimeError), transaction.atomic():
        transitions.finish_runs(runs=runs)
        raise RuntimeError("rolled back")
    assert not WebhookDelivery.objects.exists()
    finished = transitions.finish_runs(runs=runs)
    assert finished == [True, True, True] and finished.deliveries == 3
    rows = list(WebhookDelivery.objects.order_by("id"))
    assert sorted(r.task_id for r in rows) == sorted(t.task_id for t in tasks)
    assert {r.event for r in rows} == {"task.failed"}
    assert rows[0].payload["data"]["error"] == {"code": -32603, "message": "boom"}


def test_only_matching_tenant_principal_and_events_get_rows(auth: AuthContext) -> None:
    other_tenant = make_auth()
    same_tenant_other_principal = make_auth(tenant=Tenant.objects.get(pk=auth.tenant_id))
    _endpoint(other_tenant)
    mine = _endpoint(auth, principal=True)
    only_cancel = _endpoint(auth, events=["task.cancelled"])
    disabled = _endpoint(auth)
    WebhookEndpoint.objects.filter(pk=disabled.pk).update(enabled=False)
    t1 = make_task(auth)
    t2 = make_task(same_tenant_other_principal)
    transitions.transition(task=t1, to=TaskStatus.COMPLETED, result={"content": []})
    transitions.transition(task=t2, to=TaskStatus.CANCELLED, status_message="stop")
    got = set(WebhookDelivery.objects.values_list("endpoint_id", "task_id", "event"))
    assert got == {(mine.pk, t1.task_id, "task.completed"), (only_cancel.pk, t2.task_id, "task.cancelled")}


def test_a_tenant_without_endpoints_costs_one_query(auth: AuthContext,
                                                    django_assert_num_queries: Any) -> None:
    task = make_task(auth)
    with django_assert_num_queries(1):
        assert webhook_outbox.enqueue([task]) == 0


def test_claim_keeps_order_per_task_and_the_per_endpoint_limit(auth: AuthContext, settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "WEBHOOK_CONCURRENCY_PER_ENDPOINT": 2}
    _endpoint(auth)
    task = make_task(auth)
    messages.add_task_message(task=task, method="elicitation/create", params={"message": "?"})
    transitions.transition(task=task, to=TaskStatus.CANCELLED, status_message="stop")
    first, second = WebhookDelivery.objects.order_by("id")
    assert (first.event, second.event) == ("task.input_required", "task.cancelled")
    assert first.payload["data"]["status"] == "input_required"
    claimed = webhooks.claim(worker_id="w1", limit=10)
    assert [c.pk for c in claimed] == [first.pk]  # the later event waits
    assert webhooks.claim(worker_id="w2", limit=10) == []  # leased, and the next one still waits
    webhooks.record(delivery=claimed[0], worker_id="w1", code=204, error="", excerpt="")
    assert [c.pk for c in webhooks.claim(worker_id="w1", limit=10)] == [second.pk]
    # Per-endpoint limit: five tasks' events, two in flight at once.
    WebhookDelivery.objects.all().delete()
    for _ in range(5):
        transitions.transition(task=make_task(auth), to=TaskStatus.COMPLETED, result={"content": []})
    assert len(webhooks.claim(worker_id="w1", limit=10)) == 2
    assert webhooks.claim(worker_id="w2", limit=10) == []


def test_a_lapsed_lease_is_claimed_again_with_the_same_webhook_id(auth: AuthContext) -> None:
    _endpoint(auth)
    transitions.transition(task=make_task(auth), to=TaskStatus.COMPLETED, result={"content": []})
    [row] = webhooks.claim(worker_id="dead", limit=5)
    later = timezone.now() + dt.timedelta(seconds=3600)
    [again] = webhooks.claim(worker_id="alive", limit=5, now=later)
    assert again.msg_id == row.msg_id


def test_delivery_is_signed_and_verifies_with_standardwebhooks(auth: AuthContext, receiver: Receiver) -> None:
    ep = _endpoint(auth, receiver.url)
    receiver.secret = ep.secret
    assert ep.secret.startswith("whsec_")
    # Encrypted at rest.
    with connection.cursor() as cur:
        cur.execute("SELECT secret FROM tenants_webhookendpoint WHERE id = %s", [ep.pk])
        stored = cur.fetchone()[0]
    assert stored.startswith("enc1:") and ep.secret not in stored
    task = make_task(auth)
    transitions.transition(task=task, to=TaskStatus.COMPLETED, result={"content": []})
    [row] = webhooks.claim(worker_id="w", limit=5)
    code, error, _excerpt = webhooks.send(row, WebhookEndpoint.objects.get(pk=ep.pk))
    assert (code, error) == (204, "")
    [got] = receiver.received
    assert got.msg_id == row.msg_id and got.event == "task.completed" and got.task_id == task.task_id
    # Rotation: during the overlap both secrets verify; the receiver may still hold the old one.
    old = ep.secret
    new = rotate_webhook_secret(endpoint=ep)
    for secret in (old, new):
        receiver.secret = secret
        assert webhooks.send(row, WebhookEndpoint.objects.get(pk=ep.pk))[:2] == (204, "")
    WebhookEndpoint.objects.filter(pk=ep.pk).update(previous_secret_expires_at=timezone.now())
    receiver.secret = old
    assert webhooks.send(row, WebhookEndpoint.objects.get(pk=ep.pk))[0] == 401


def test_signature_header_is_the_package_signature() -> None:
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    header = webhooks.signature_header(secrets_=[secret], msg_id="msg_1", timestamp=when, body="{}")
    assert header == Webhook(secret).sign(msg_id="msg_1", timestamp=when, data="{}")


def test_loopback_is_refused_without_the_allowed_network(auth: AuthContext, receiver: Receiver,
                                                         settings: Any) -> None:
    ep = _endpoint(auth, receiver.url)
    settings.TENANTS = {**settings.TENANTS, "OUTBOUND_ALLOWED_NETWORKS": ()}
    transitions.transition(task=make_task(auth), to=TaskStatus.COMPLETED, result={"content": []})
    [row] = webhooks.claim(worker_id="w", limit=5)
    code, error, _ = webhooks.send(row, ep)
    assert code is None and "OutboundRefused" in error
    assert receiver.received == []


def test_redirects_are_not_followed(auth: AuthContext, receiver: Receiver) -> None:
    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.send_response(307)
            self.send_header("Location", receiver.url)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ep = _endpoint(auth, f"http://127.0.0.1:{server.server_address[1]}/r")
        transitions.transition(task=make_task(auth), to=TaskStatus.COMPLETED, result={"content": []})
        [row] = webhooks.claim(worker_id="w", limit=5)
        code, error, _ = webhooks.send(row, ep)
    finally:
        server.shutdown()
        server.server_close()
    assert code == 307 and error == "HTTP 307"
    assert receiver.received == []


def test_failing_for_the_whole_period_gives_up_and_disables_the_endpoint(auth: AuthContext,
                                                                         settings: Any,
                                                                         caplog: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "WEBHOOK_RETRY_PERIOD_S": 60.0}
    ep = _endpoint(auth, "http://127.0.0.1:9/closed")
    transitions.transition(task=make_task(auth), to=TaskStatus.COMPLETED, result={"content": []})
    [row] = webhooks.claim(worker_id="w", limit=5)
    assert webhooks.record(delivery=row, worker_id="w", code=None, error="ConnectionRefusedError", excerpt="") \
        == WebhookDelivery.State.PENDING
    row.refresh_from_db()
    assert row.attempts == 1 and row.next_attempt_at > timezone.now()
    assert WebhookEndpoint.objects.get(pk=ep.pk).enabled
    later = timezone.now() + dt.timedelta(seconds=61)
    [row] = webhooks.claim(worker_id="w", limit=5, now=later)
    assert webhooks.record(delivery=row, worker_id="w", code=503, error="HTTP 503", excerpt="busy", now=later) \
        == WebhookDelivery.State.FAILED
    ep.refresh_from_db()
    assert not ep.enabled and ep.disabled_reason
    assert AuditEvent.objects.filter(action="webhook.disabled", tenant_id=auth.tenant_id).exists()
    assert "disabled" in caplog.text
    assert ep.secret not in caplog.text


def test_cli_webhook_add_prints_the_secret_last(auth: AuthContext, capsys: Any) -> None:
    call_command("mcptasks_tenant", "webhook", "add", auth.tenant_slug, "https://hooks.example.com/x",
                 "--principal", auth.principal_name, "--events", "task.completed", "task.failed")
    lines = capsys.readouterr().out.strip().splitlines()
    ep = WebhookEndpoint.objects.get(tenant_id=auth.tenant_id)
    assert lines[-1] == ep.secret and ep.secret.startswith("whsec_")
    assert ep.principal_id == auth.principal_id and ep.events == ["task.completed", "task.failed"]
    call_command("mcptasks_tenant", "webhook", "list", auth.tenant_slug)
    listing = capsys.readouterr().out
    assert "hooks.example.com" in listing and ep.secret not in listing


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest", "http://localhost/x", "file:///etc/passwd"])
def test_refused_destinations_cannot_be_registered(auth: AuthContext, settings: Any, url: str) -> None:
    settings.TENANTS = {**settings.TENANTS, "OUTBOUND_ALLOWED_NETWORKS": ()}
    from tenants.cli import CliError, webhook_add

    with pytest.raises(CliError):
        webhook_add(slug=auth.tenant_slug, url=url)
    assert not WebhookEndpoint.objects.exists()


def test_metrics_stats(auth: AuthContext) -> None:
    _endpoint(auth)
    transitions.transition(task=make_task(auth), to=TaskStatus.COMPLETED, result={"content": []})
    transitions.transition(task=make_task(auth), to=TaskStatus.COMPLETED, result={"content": []})
    [a, b] = webhooks.claim(worker_id="w", limit=5)
    webhooks.record(delivery=a, worker_id="w", code=204, error="", excerpt="")
    webhooks.record(delivery=b, worker_id="w", code=500, error="HTTP 500", excerpt="")
    assert webhooks.stats() == {"delivered": 1, "failed": 0, "pending": 1, "failed_attempts": 1}
    from mcptasks.console import metrics

    text = metrics.render().decode()
    assert "mcptasks_webhook_outbox_depth 1.0" in text
    assert 'mcptasks_webhook_deliveries{state="delivered"} 1.0' in text
    assert "mcptasks_webhook_failed_attempts 1.0" in text


def test_cleanup_deletes_old_finished_deliveries_and_keeps_the_outbox(auth: AuthContext) -> None:
    _endpoint(auth)
    for _ in range(3):
        transitions.transition(task=make_task(auth), to=TaskStatus.COMPLETED, result={"content": []})
    delivered, failed, pending = WebhookDelivery.objects.order_by("id")
    WebhookDelivery.objects.filter(pk=delivered.pk).update(state=WebhookDelivery.State.DELIVERED)
    WebhookDelivery.objects.filter(pk=failed.pk).update(state=WebhookDelivery.State.FAILED)
    later = timezone.now() + dt.timedelta(days=8)
    assert cleanup.cleanup_expired(now=later)["webhooks"] == 2
    assert list(WebhookDelivery.objects.values_list("pk", flat=True)) == [pending.pk]


def test_one_endpoints_backlog_does_not_starve_another(auth: AuthContext, settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "WEBHOOK_CONCURRENCY_PER_ENDPOINT": 1}
    busy = _endpoint(auth, "https://busy.example.com/h")
    for _ in range(20):
        transitions.transition(task=make_task(auth), to=TaskStatus.COMPLETED, result={"content": []})
    quiet = _endpoint(auth, "https://quiet.example.com/h")
    transitions.transition(task=make_task(auth), to=TaskStatus.COMPLETED, result={"content": []})
    claimed = webhooks.claim(worker_id="w", limit=3)
    assert sorted(c.endpoint_id for c in claimed) == sorted([busy.pk, quiet.pk])


def test_a_receiver_trickling_bytes_is_cut_off_at_the_timeout(auth: AuthContext, settings: Any) -> None:
    import socket
    import time

    settings.MCPTASKS = {**settings.MCPTASKS, "WEBHOOK_TIMEOUT_S": 1.0}
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100:
                if stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.3)  # each read well within the timeout, the whole answer far past it

    threading.Thread(target=trickle, daemon=True).start()
    ep = _endpoint(auth, f"http://127.0.0.1:{listener.getsockname()[1]}/slow")
    transitions.transition(task=make_task(auth), to=TaskStatus.COMPLETED, result={"content": []})
    [row] = webhooks.claim(worker_id="w", limit=5)
    started = time.monotonic()
    try:
        code, error, _ = webhooks.send(row, ep)
    finally:
        stop.set()
        listener.close()
    assert time.monotonic() - started < 3
    assert code is None and error


def test_only_the_owners_endpoint_sees_input_requests(auth: AuthContext) -> None:
    """As tasks/get: a tenant-wide endpoint gets the status, never the owner's elicitation text."""
    tenant_wide = _endpoint(auth)
    owners = _endpoint(auth, principal=True)
    task = make_task(auth)
    messages.add_task_message(task=task, method="elicitation/create", params={"message": "the secret plan?"})
    rows = {r.endpoint_id: r for r in WebhookDelivery.objects.all()}
    assert rows[owners.pk].payload["data"]["inputRequests"]
    assert "the secret plan?" in str(rows[owners.pk].payload)
    assert rows[tenant_wide.pk].payload["data"]["status"] == "input_required"
    assert "inputRequests" not in rows[tenant_wide.pk].payload["data"]
    assert "the secret plan?" not in str(rows[tenant_wide.pk].payload)
    assert rows[owners.pk].msg_id != rows[tenant_wide.pk].msg_id


def test_a_poll_with_nothing_due_costs_one_read() -> None:
    """A worker polls the outbox every WEBHOOK_POLL_S whether or not any endpoint exists: with
    nothing due it reads the partial index once (no transaction, claim lock or ranked query)."""
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert webhooks.claim(worker_id="w-idle", limit=4) == []
    assert len(queries.captured_queries) == 1, [q["sql"] for q in queries.captured_queries]
