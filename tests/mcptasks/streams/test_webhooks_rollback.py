"""A rolled-back transition sends nothing, end to end: the real transition, the real outbox, the
real delivery loop (``WebhookSender``) and a real receiver verifying with ``standardwebhooks``,
on PostgreSQL (committed transactions: the sender's threads have connections of their own)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import close_old_connections, transaction

from mcptasks.models import Task, TaskStatus, WebhookDelivery
from mcptasks.streams import webhooks
from mcptasks.tasks import transitions
from tenants.models import Tenant
from tenants.services import add_webhook_endpoint
from tests.support.factories import make_auth, make_task
from tests.support.requirements import require_postgres
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)

POLL_S = 0.05


@pytest.fixture(autouse=True)
def _postgres_and_fast_polls(settings: Any) -> None:
    require_postgres()
    settings.TENANTS = {**settings.TENANTS, "OUTBOUND_ALLOWED_NETWORKS": ("127.0.0.0/8",)}
    settings.MCPTASKS = {**settings.MCPTASKS, "WEBHOOK_POLL_S": POLL_S}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(secret="").start()
    yield r
    r.stop()


class Polls:
    """Counts the passes of a delivery loop over the outbox (its claims, each a transaction of its own)."""

    def __init__(self, sender: webhooks.WebhookSender) -> None:
        self._lock = threading.Lock()
        self.sender = sender
        self.done = 0
        claim = sender._claim

        def counted(limit: int) -> list[WebhookDelivery]:
            try:
                return claim(limit)
            finally:
                with self._lock:
                    self.done += 1

        setattr(sender, "_claim", counted)  # noqa: B010 - an instance attribute over the method

    def wait(self, more: int) -> None:
        """Wait until ``more`` passes have ended after now (the first may have begun before now)."""
        target = self.done + more
        wait_for(f"{more} more passes over the outbox", lambda: self.done >= target, timeout=20, every=0.01)

    def settle(self) -> None:
        """Wait for passes that began after now, and for every delivery they claimed to end."""
        self.wait(3)
        wait_for("the deliveries in flight", lambda: self.sender.in_flight == 0, timeout=20, every=0.01)


@contextlib.contextmanager
def delivery_loop() -> Iterator[Polls]:
    """The workers' delivery loop, running in a thread of its own until the block ends."""
    sender = webhooks.WebhookSender(worker_id="rollback-test", threads=2)
    polls = Polls(sender)
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        task = loop.create_task(sender.run())
        loop.call_soon(started.set)
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)
        close_old_connections()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(5)
    try:
        yield polls
    finally:
        for t in asyncio.all_tasks(loop):
            loop.call_soon_threadsafe(t.cancel)
        thread.join(10)
        sender.shutdown()
        loop.close()


def test_a_rolled_back_transition_is_never_delivered_while_a_committed_one_is(receiver: Receiver) -> None:
    auth = make_auth()
    endpoint = add_webhook_endpoint(tenant=Tenant.objects.get(pk=auth.tenant_id), url=receiver.url, principal=None,
                                    events=["task.completed", "task.failed"])
    receiver.secret = endpoint.secret
    undone, kept = make_task(auth), make_task(auth)
    with delivery_loop() as polls:
        with pytest.raises(RuntimeError), transaction.atomic():
            assert transitions.transition(task=undone, to=TaskStatus.COMPLETED, result={"content": []})
            # The outbox row exists in this transaction, while the delivery loop polls several
            # times (all but the first of these passes began after the row was written).
            assert WebhookDelivery.objects.filter(task_id=undone.task_id).count() == 1
            polls.wait(3)
            raise RuntimeError("the transition's transaction fails after writing the outbox row")
        assert transitions.transition(task=kept, to=TaskStatus.FAILED, error={"code": -32603, "message": "boom"})
        wait_for("the committed transition's event", lambda: len(receiver.received) >= 1, timeout=20)
        # The loop keeps polling; nothing more may come: once the delivery is recorded, the passes
        # that began after it, and whatever they sent, have ended without another request.
        wait_for("the delivery recorded", lambda: WebhookDelivery.objects.filter(
            task_id=kept.task_id, state=WebhookDelivery.State.DELIVERED).exists(), timeout=20)
        polls.settle()
    assert receiver.rejected == 0
    assert [(r.task_id, r.event) for r in receiver.received] == [(kept.task_id, "task.failed")]
    assert Task.objects.get(pk=undone.pk).status == TaskStatus.WORKING
    assert not WebhookDelivery.objects.filter(task_id=undone.task_id).exists()
    assert WebhookDelivery.objects.get(task_id=kept.task_id).state == WebhookDelivery.State.DELIVERED
