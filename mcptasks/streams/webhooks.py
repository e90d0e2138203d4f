"""Signed webhooks for task events: the workers' delivery loop.

The rows are written by the outbox (:mod:`mcptasks.tasks.webhook_outbox`) in the transaction
that changes a task's status.
Workers (:class:`WebhookSender`) claim due rows with ``FOR UPDATE SKIP LOCKED`` and a lease,
in order per task and endpoint (an event waits until the task's earlier events for that
endpoint are delivered or given up), at most ``WEBHOOK_CONCURRENCY_PER_ENDPOINT`` in flight per
endpoint, and POST them in the Standard Webhooks format through the outbound policy
(:func:`tenants.outbound.build_opener`, no redirects). Failures are retried with exponential
backoff and jitter for ``WEBHOOK_RETRY_PERIOD_S``; an endpoint failing that long is disabled
(audited, logged). Delivery is at least once: a worker killed mid-request loses its lease and
the row is sent again with the same ``webhook-id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import http.client
import json
import logging
import random
import socket
import threading
import urllib.error
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import close_old_connections, connection, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, Sum, Window
from django.db.models.functions import RowNumber
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from mcptasks import conf
from mcptasks.audit import trail as audit
from mcptasks.models import WebhookDelivery
from tenants.models import WebhookEndpoint
from tenants.outbound import build_opener

logger = logging.getLogger(__name__)

#: Advisory lock serialising claims, so the per-endpoint in-flight count cannot be overshot.
CLAIM_LOCK_KEY = zlib.crc32(b"mcptasks.streams.webhooks.claim") - 2**31
#: Bytes of a receiver's response kept for operators.
EXCERPT_BYTES = 200
USER_AGENT = "mcptasks-webhooks/1"


# --- claiming --------------------------------------------------------------------------------


def claim(*, worker_id: str, limit: int, now: dt.datetime | None = None) -> list[WebhookDelivery]:
    """Take up to ``limit`` due deliveries for ``worker_id`` (leased), in order per task.

    A row is due when pending, its next attempt has come, its lease (if any) lapsed, its
    endpoint is enabled, and no earlier pending row of the same task and endpoint exists. At most
    ``WEBHOOK_CONCURRENCY_PER_ENDPOINT`` rows of an endpoint are leased at once.
    """
    if limit <= 0:
        return []
    s = conf.get()
    now = now or timezone.now()
    if not WebhookDelivery.objects.filter(state=WebhookDelivery.State.PENDING, next_attempt_at__lte=now).exists():
        # The common case (no delivery due, often no endpoint at all): one read of the partial
        # index instead of a transaction, the claim lock and the ranked query on every poll.
        return []
    on_pg = connection.vendor == "postgresql"
    with transaction.atomic():
        if on_pg:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", [CLAIM_LOCK_KEY])
        earlier = WebhookDelivery.objects.filter(
            endpoint_id=OuterRef("endpoint_id"), task_id=OuterRef("task_id"), id__lt=OuterRef("id"),
            state=WebhookDelivery.State.PENDING,
        )
        due = (
            WebhookDelivery.objects.filter(state=WebhookDelivery.State.PENDING, next_attempt_at__lte=now,
                                           endpoint__enabled=True)
            .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
            .filter(~Exists(earlier))
        )
        cap = s.WEBHOOK_CONCURRENCY_PER_ENDPOINT
        busy = dict(
            WebhookDelivery.objects.filter(state=WebhookDelivery.State.PENDING, lease_expires_at__gte=now)
            .values_list("endpoint_id").annotate(n=Count("id")).order_by()
        )
        full = [endpoint for endpoint, n in busy.items() if n >= cap]
        if full:
            due = due.exclude(endpoint_id__in=full)
        # Ranked per endpoint without locks (a window cannot be locked), so one busy endpoint's
        # backlog never fills the batch: every endpoint's first due row, then every second...
        ranked = list(
            due.annotate(turn=Window(RowNumber(), partition_by=[F("endpoint_id")],
                                     order_by=[F("next_attempt_at").asc(), F("id").asc()]))
            .filter(turn__lte=cap)
            .order_by("turn", "next_attempt_at", "id")
            .values_list("pk", flat=True)[: limit * 4]
        )
        position = {pk: i for i, pk in enumerate(ranked)}
        locked = due.filter(pk__in=ranked)
        if on_pg:
            # Re-checked under the row locks: a row delivered or failed meanwhile drops out.
            locked = locked.select_for_update(skip_locked=True, of=("self",))
        candidates = sorted(locked, key=lambda row: position[row.pk])
        taken: list[WebhookDelivery] = []
        for row in candidates:
            if len(taken) >= limit:
                break
            if busy.get(row.endpoint_id, 0) >= cap:
                continue
            busy[row.endpoint_id] = busy.get(row.endpoint_id, 0) + 1
            taken.append(row)
        if taken:
            lease = now + dt.timedelta(seconds=s.WEBHOOK_LEASE_S)
            WebhookDelivery.objects.filter(pk__in=[r.pk for r in taken]).update(
                lease_expires_at=lease, worker_id=worker_id[:64]
            )
            for row in taken:
                row.lease_expires_at, row.worker_id = lease, worker_id[:64]
    return taken


# --- sending ---------------------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer (a failure), never followed: the target would escape the checks."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def signature_header(*, secrets_: list[str], msg_id: str, timestamp: dt.datetime, body: str) -> str:
    """``webhook-signature``: one ``v1,…`` per secret, space-separated (several during a rotation)."""
    return " ".join(Webhook(secret).sign(msg_id=msg_id, timestamp=timestamp, data=body) for secret in secrets_)


def send(delivery: WebhookDelivery, endpoint: WebhookEndpoint) -> tuple[int | None, str, str]:
    """POST one delivery; ``(status code or None, error or "", response excerpt)``. Never raises."""
    body = json.dumps(delivery.payload, separators=(",", ":"), ensure_ascii=False)
    stamp = dt.datetime.now(dt.UTC)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "webhook-id": delivery.msg_id,
        "webhook-timestamp": str(int(stamp.timestamp())),
        "webhook-signature": signature_header(secrets_=endpoint.signing_secrets(now=timezone.now()),
                                              msg_id=delivery.msg_id, timestamp=stamp, body=body),
    }
    # The scheme is http(s) (validated on save); the address is checked at connect time.
    request = urllib.request.Request(endpoint.url, data=body.encode(), headers=headers, method="POST")  # noqa: S310
    timeout = conf.get().WEBHOOK_TIMEOUT_S
    sockets: list[socket.socket] = []
    opener = build_opener(_NoRedirect, on_connect=sockets.append)
    # The timeout bounds each read; this bounds the whole request (a receiver trickling bytes
    # would otherwise hold a thread, and past the lease a second one, for as long as it likes).
    watchdog = threading.Timer(timeout, _shut, args=(sockets,))
    watchdog.daemon = True
    watchdog.start()
    try:
        with opener.open(request, timeout=timeout) as response:
            excerpt = response.read(EXCERPT_BYTES)
            code = int(response.status)
    except urllib.error.HTTPError as exc:
        try:
            excerpt = exc.read(EXCERPT_BYTES)
        except Exception:
            excerpt = b""
        exc.close()
        return exc.code, f"HTTP {exc.code}", _text(excerpt)
    except urllib.error.URLError as exc:
        # The reason only (a refused address, a timeout): never the URL, which may carry a token.
        return None, f"{type(exc.reason).__name__}: {str(exc.reason)[:200]}", ""
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return None, f"{type(exc).__name__}: {str(exc)[:200]}", ""
    finally:
        watchdog.cancel()
        _shut(sockets)
    if 200 <= code < 300:
        return code, "", _text(excerpt)
    return code, f"HTTP {code}", _text(excerpt)


def _shut(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")[:EXCERPT_BYTES].replace("\x00", "")


def backoff_s(attempts: int) -> float:
    """Delay before the next attempt after ``attempts`` failures: doubling, capped, jittered."""
    s = conf.get()
    ceiling = min(s.WEBHOOK_BACKOFF_MAX_S, s.WEBHOOK_BACKOFF_BASE_S * 2 ** min(max(attempts - 1, 0), 40))
    # Half fixed, half random: spreads retries of many rows without ever retrying at once.
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def record(*, delivery: WebhookDelivery, worker_id: str, code: int | None, error: str, excerpt: str,
           now: dt.datetime | None = None) -> str:
    """Store one attempt's outcome; returns the delivery's state afterwards."""
    s = conf.get()
    now = now or timezone.now()
    mine = WebhookDelivery.objects.filter(pk=delivery.pk, state=WebhookDelivery.State.PENDING)
    if not error:
        # Delivered is true whoever holds the lease now (a lapsed lease: the other copy is a duplicate).
        mine.update(state=WebhookDelivery.State.DELIVERED, delivered_at=now, attempts=F("attempts") + 1,
                    last_status_code=code, last_error="", response_excerpt=excerpt, lease_expires_at=None)
        WebhookEndpoint.objects.filter(pk=delivery.endpoint_id).update(last_success_at=now, failing_since=None)
        return WebhookDelivery.State.DELIVERED
    attempts = delivery.attempts + 1
    deadline = delivery.created_at + dt.timedelta(seconds=s.WEBHOOK_RETRY_PERIOD_S)
    gave_up = now >= deadline
    nxt = min(now + dt.timedelta(seconds=backoff_s(attempts)), deadline)
    state = WebhookDelivery.State.FAILED if gave_up else WebhookDelivery.State.PENDING
    with transaction.atomic():
        changed = mine.filter(worker_id=worker_id[:64]).update(
            state=state, attempts=F("attempts") + 1, last_status_code=code, last_error=error[:300],
            response_excerpt=excerpt, next_attempt_at=nxt, lease_expires_at=None,
        )
        if changed:
            WebhookEndpoint.objects.filter(pk=delivery.endpoint_id, failing_since__isnull=True).update(
                failing_since=now)
            _maybe_disable(endpoint_id=delivery.endpoint_id, now=now)
    return state


def _maybe_disable(*, endpoint_id: int, now: dt.datetime) -> None:
    """Disable an endpoint that has failed for the whole retry period (audited, logged once)."""
    period = conf.get().WEBHOOK_RETRY_PERIOD_S
    cutoff = now - dt.timedelta(seconds=period)
    reason = f"no successful delivery for {int(period)} s"
    hit = WebhookEndpoint.objects.filter(pk=endpoint_id, enabled=True, failing_since__lte=cutoff).update(
        enabled=False, disabled_reason=reason)
    if hit:
        tenant_id = WebhookEndpoint.objects.filter(pk=endpoint_id).values_list("tenant_id", flat=True).first()
        audit.append(tenant_id=tenant_id, principal_id=None, action="webhook.disabled",
                     data={"endpoint": endpoint_id, "reason": reason})
        logger.warning("webhook endpoint %s disabled: %s", endpoint_id, reason)


def redeliver(*, deliveries: list[WebhookDelivery], operator: Any) -> int:
    """Send ``deliveries`` again now (same ``webhook-id``), audited per tenant; returns how many."""
    now = timezone.now()
    ids = [d.pk for d in deliveries]
    n = WebhookDelivery.objects.filter(pk__in=ids).update(
        state=WebhookDelivery.State.PENDING, next_attempt_at=now, lease_expires_at=None, created_at=now)
    for d in deliveries:
        audit.append(tenant_id=d.tenant_id, principal_id=None, action="webhook.redeliver", task_id=d.task_id,
                     data={"operator": operator.get_username()[:150], "operator_id": operator.pk,
                           "delivery": d.pk, "event": d.event})
    return int(n)


def deliver_one(delivery: WebhookDelivery, worker_id: str) -> str:
    """Send one claimed delivery and record the outcome (in the calling thread)."""
    try:
        endpoint = WebhookEndpoint.objects.get(pk=delivery.endpoint_id)
        code, error, excerpt = send(delivery, endpoint)
        return record(delivery=delivery, worker_id=worker_id, code=code, error=error, excerpt=excerpt)
    finally:
        close_old_connections()


def stats() -> dict[str, int]:
    """Stored deliveries by state, failed attempts, and the outbox depth (for ``/metrics``)."""
    rows = dict(WebhookDelivery.objects.values_list("state").annotate(n=Count("id")).order_by())
    attempts = WebhookDelivery.objects.aggregate(n=Sum("attempts"))["n"] or 0
    delivered = int(rows.get(WebhookDelivery.State.DELIVERED, 0))
    return {
        "delivered": delivered,
        "failed": int(rows.get(WebhookDelivery.State.FAILED, 0)),
        "pending": int(rows.get(WebhookDelivery.State.PENDING, 0)),
        "failed_attempts": int(attempts) - delivered,
    }


class WebhookSender:
    """A worker's delivery loop: claims due rows and POSTs them from a pool of threads."""

    def __init__(self, *, worker_id: str, threads: int | None = None) -> None:
        self.worker_id = worker_id
        self.threads = threads or conf.get().WEBHOOK_WORKER_THREADS
        self.pool = ThreadPoolExecutor(max_workers=self.threads + 1, thread_name_prefix="mcptasks-webhook")
        self.in_flight = 0
        self.wake = asyncio.Event()

    async def run(self) -> None:
        """Claim and send until cancelled (poll every ``WEBHOOK_POLL_S``, or sooner when woken)."""
        loop = asyncio.get_running_loop()
        while True:
            free = self.threads - self.in_flight
            claimed: list[WebhookDelivery] = []
            if free > 0:
                try:
                    claimed = await loop.run_in_executor(self.pool, self._claim, free)
                except Exception:
                    logger.warning("claiming webhook deliveries failed", exc_info=True)
            for row in claimed:
                self.in_flight += 1
                fut = loop.run_in_executor(self.pool, deliver_one, row, self.worker_id)
                fut.add_done_callback(self._done)
            if claimed and len(claimed) >= free:
                await asyncio.sleep(0)
                continue
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=conf.get().WEBHOOK_POLL_S)

    def _claim(self, limit: int) -> list[WebhookDelivery]:
        try:
            return claim(worker_id=self.worker_id, limit=limit)
        finally:
            close_old_connections()

    def _done(self, fut: asyncio.Future[Any]) -> None:
        self.in_flight -= 1
        self.wake.set()
        if not fut.cancelled() and fut.exception() is not None:
            logger.warning("a webhook delivery failed to record", exc_info=fut.exception())

    def shutdown(self) -> None:
        """Stop the threads (a request in flight keeps its lease; another worker retries it)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
