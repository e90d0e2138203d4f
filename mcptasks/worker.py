"""The worker: claims tasks with leases, runs tools, heartbeats, recovers from crashes.

Claiming is a short transaction (``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL) that
stamps the next attempt number, the worker id and a lease; the tool runs outside it. A
heartbeat renews the leases of every running task in one UPDATE and reads the cancel flag.
When a worker dies, its leases lapse and another worker either re-runs the task (retryable
tools, up to ``max_attempts``) or fails it with "worker lost during execution". Every outcome
is written with ``WHERE attempt = <ours>`` so a superseded run can never overwrite the task.

On SIGTERM the worker stops claiming, lets running tools finish within the shutdown grace and
hands the rest back: their lease is released at once and the interrupted run does not count
against ``max_attempts`` (the next run still gets a fresh attempt number).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt
import functools
import json
import logging
import os
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone

from tenants import conf as tenants_conf

from . import audit, bus, conf, layers, observability, services, webhooks
from .context import ToolCancelled, ToolContext
from .models import LIVE, McpSession, Outcome, Task, TaskMessage, TaskStatus
from .protocol.errors import CAPABILITY_MISSING, INTERNAL_ERROR, McpError
from .protocol.jsonrpc import unstorable_string
from .protocol.messages import related_task_meta
from .registry import Registry, ToolInputError, registry

logger = logging.getLogger(__name__)


def resident_memory_bytes() -> int:
    """This process's resident memory (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0

#: The statusMessage of a non-retryable task whose worker died (documented; tests rely on it).
WORKER_LOST = "worker lost during execution"


def storable_problem(result: dict[str, Any] | None) -> str | None:
    """Why a tool's result cannot be stored and sent (None if it can): not JSON, text that
    PostgreSQL or UTF-8 refuse, or larger than ``MCPTASKS_RESULT_MAX_BYTES``."""
    if result is None:
        return None
    try:
        encoded = json.dumps(result, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"not JSON-serialisable ({str(exc)[:120]})"
    bad = unstorable_string(result)
    if bad is not None:
        return f"it contains {bad}"
    limit = conf.get().RESULT_MAX_BYTES
    if len(encoded.encode("utf-8", "surrogatepass")) > limit:
        return f"larger than the {limit}-byte limit"
    return None


#: Re-add the worker to its channel-layer groups this often (the layer expires memberships).
GROUP_REFRESH_S = 3600.0


def _reconnecting(fn: Any) -> Any:
    """Wrap ORM code so a broken connection is dropped (the next call reconnects)."""

    def inner(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (OperationalError, InterfaceError):
            if not connection.in_atomic_block:
                connection.close()
            raise

    return inner


def _db(fn: Any) -> Any:
    """Run ORM code in the worker's database thread.

    The connection is kept across calls (a worker is long-lived; reconnecting for every query
    would dominate short tasks) and dropped only when it breaks, so the next call reconnects.
    """
    return sync_to_async(_reconnecting(fn), thread_sensitive=True)


class _LeaseThread:
    """One thread of its own, with its own database connection, for heartbeats and renewals.

    Lease renewal must never queue behind tool code or the tools' database work: sync tools
    run in the worker's tool executor, async tools' ORM calls in the shared database thread,
    and this thread does nothing but keep the worker's leases and heartbeat row alive.
    """

    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcptasks-lease")

    def __call__(self, fn: Any) -> Any:
        wrapped = _reconnecting(fn)

        async def run(*args: Any, **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, functools.partial(wrapped, *args, **kwargs))

        return run

    def shutdown(self) -> None:
        """Close the thread's connection and stop it."""
        self.executor.submit(connection.close)
        self.executor.shutdown(wait=True)


#: Most outcomes written in one transaction.
FINISH_BATCH = 100


def _delivered(written: list[bool]) -> bool:
    """Whether a written batch may have webhook rows (unknown counts as yes)."""
    return not isinstance(written, services.Finished) or written.deliveries > 0


def _outcome(task: Task, status: str, message: str | None, *, result: dict[str, Any] | None = None,
             error: dict[str, Any] | None = None) -> Outcome:
    return Outcome(pk=task.pk, attempt=task.attempt, status=status, message=message, result=result, error=error)


#: A worker holds at most this many times its concurrency in runs, counting those that wait
#: for their client (which do not count against the concurrency itself).
WAITING_FACTOR = 4

#: Seconds between two saves of a run's progress on its task row (the operator's task page).
PROGRESS_SAVE_EVERY_S = 1.0


class WorkerBackend:
    """The :class:`ToolContext` backend for a tool running in this worker."""

    def __init__(self, worker: Worker, task: Task) -> None:
        self.worker = worker
        self.task = task
        self.attempt = task.attempt
        self.cancel_flag = False
        self.handed_back = False
        #: The tool has returned and its outcome is queued or being written: nothing left to stop.
        self.finishing = False
        self.answered = asyncio.Event()
        #: Requests of this run waiting for the client (a run that waits does not count as busy).
        self.awaiting_client = 0
        self._capabilities: dict[str, Any] | None = None
        #: Progress coalescing (a token bucket of ``PROGRESS_MAX_PER_S`` a second, as many in a
        #: burst): tokens left and when they were counted, the latest report held back, and the
        #: timer that sends it.
        self._progress_tokens: float | None = None
        self._progress_at = 0.0
        self._progress_pending: dict[str, Any] | None = None
        self._progress_timer: asyncio.Future[Any] | None = None
        #: Saving the latest report on the task (:meth:`_save_progress`): when last saved, and
        #: the report not saved yet.
        self._progress_saved_at = float("-inf")
        self._progress_unsaved: dict[str, Any] | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancel_flag

    async def _session(self) -> McpSession | None:
        return await _db(lambda: McpSession.objects.filter(pk=self.task.session_id).first())()

    def client_supports(self, capability: str) -> bool:
        return capability in (self._capabilities or {})

    async def load(self) -> None:
        """The client's declared capabilities (fetched by the claim query when it could)."""
        if hasattr(self.task, "client_caps"):
            # Fetched by the claim; None when the task has no session (left, or enqueued without one).
            caps = self.task.client_caps
            self._capabilities = dict(caps) if isinstance(caps, dict) else {}
            return
        session = await self._session()
        self._capabilities = dict(session.client_capabilities) if session else {}

    def _still_ours(self) -> bool:
        return Task.objects.is_current_run(task_id=self.task.task_id, attempt=self.attempt)

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        token = self.task.progress_token
        if self.cancel_flag:
            return
        await self._save_progress({"progress": progress, "total": total, "message": message})
        if token is None:
            return
        params: dict[str, Any] = {"progressToken": token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        if self.task.kind == Task.Kind.TASK:
            params["_meta"] = related_task_meta(self.task.task_id)
        note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}
        wait = self._progress_wait()
        if wait > 0:
            # Over the rate: keep only the latest report, sent once a token is back (stream rows
            # stay at the rate however fast the tool reports).
            self._progress_pending = note
            if self._progress_timer is None:
                self._progress_timer = asyncio.ensure_future(self._send_later(wait))
            return
        self._progress_pending = None
        if not await self._send_progress(note):
            self.cancel_flag = True
            raise ToolCancelled("the task is no longer running")

    async def _save_progress(self, report: dict[str, Any] | None, *, force: bool = False) -> None:
        """Keep ``report`` as the task's progress (its page shows it): written at most once a
        second, so a chatty tool costs no more than a row update a second; the latest report
        held back is written by :meth:`flush_progress` before the outcome."""
        if report is not None:
            self._progress_unsaved = report
        report = self._progress_unsaved
        now = asyncio.get_running_loop().time()
        if report is None or (not force and now - self._progress_saved_at < PROGRESS_SAVE_EVERY_S):
            return
        self._progress_saved_at, self._progress_unsaved = now, None
        task_id, attempt = self.task.task_id, self.attempt
        await _db(lambda: Task.objects.live().filter(task_id=task_id, attempt=attempt).update(progress=report))()

    def _progress_wait(self) -> float:
        """Take a token for one notification (0: send now), else how long until one is back."""
        rate = conf.get().PROGRESS_MAX_PER_S
        if rate <= 0:
            return 0.0
        now = asyncio.get_running_loop().time()
        burst = max(rate, 1.0)
        tokens = burst if self._progress_tokens is None else min(
            burst, self._progress_tokens + (now - self._progress_at) * rate
        )
        self._progress_at = now
        if tokens >= 1:
            self._progress_tokens = tokens - 1
            return 0.0
        self._progress_tokens = tokens
        return (1 - tokens) / rate

    async def _send_progress(self, note: dict[str, Any]) -> bool:
        """Publish one progress notification if the run is still current (False: it is not)."""

        def send() -> bool:
            # Progress stops at the terminal status (and for a superseded attempt).
            if not self._still_ours():
                return False
            services.publish_for_task(task=self.task, message=note)
            return True

        return bool(await _db(send)())

    async def _send_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._progress_timer = None
        try:
            wait = self._progress_wait()
            if wait > 0:  # only if the clock cheated: try again when the token is back
                self._progress_timer = asyncio.ensure_future(self._send_later(wait))
                return
            await self.flush_progress()
        except Exception:
            logger.warning("sending coalesced progress of task %s failed", self.task.task_id, exc_info=True)

    async def flush_progress(self) -> None:
        """Send the report held back by the rate limit, if any (before the run's outcome: the
        last report is never lost, even when it costs one notification over the rate)."""
        if self._progress_timer is not None:
            self._progress_timer.cancel()
            self._progress_timer = None
        note, self._progress_pending = self._progress_pending, None
        if note is not None and not self.cancel_flag:
            await self._send_progress(note)
        if not self.cancel_flag:
            await self._save_progress(None, force=True)

    async def log(self, level: str, data: Any, logger_name: str | None) -> None:
        session = await self._session()
        if session is None or not services.log_level_allows(session.log_level, level):
            return
        params: dict[str, Any] = {"level": level, "data": data}
        if logger_name:
            params["logger"] = logger_name
        if self.task.kind == Task.Kind.TASK:
            params["_meta"] = related_task_meta(self.task.task_id)
        await _db(services.publish_for_task)(
            task=self.task, message={"jsonrpc": "2.0", "method": "notifications/message", "params": params}
        )

    async def set_status_message(self, message: str) -> None:
        await _db(services.set_status_message)(task=self.task, message=message, attempt=self.attempt)

    async def close_stream(self) -> None:
        """Close the client's connection to a plain request's POST stream (it resumes by GET)."""
        if self.task.kind == Task.Kind.REQUEST and self.task.stream_id:
            await _db(bus.publish)(session_id=self.task.session_id, stream_id=self.task.stream_id,
                                   message={"_close": True})

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        capability = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling",
                      "roots/list": "roots"}.get(method)
        if capability and not self.client_supports(capability):
            raise McpError(CAPABILITY_MISSING, f"The client did not declare the {capability} capability",
                           {"requiredCapabilities": {capability: {}}})
        self.answered.clear()
        msg = await _db(services.add_task_message)(task=self.task, method=method, params=params)
        self.awaiting_client += 1
        # A run waiting for its client (for a 2026-07-28 client, maybe for a retry that never
        # comes) frees its slot: the claim loop may start other work meanwhile.
        self.worker.wake.set()
        try:
            return await self._await_answer(method, msg)
        finally:
            self.awaiting_client -= 1

    async def _await_answer(self, method: str, msg: TaskMessage) -> dict[str, Any]:
        poll = conf.get().WORKER_HEARTBEAT_S
        while True:
            if self.cancel_flag:
                raise ToolCancelled("cancelled while waiting for the client")
            # An unanswered request is bounded by the task's ttl: past it nobody can answer.
            remaining = (
                (self.task.expires_at - timezone.now()).total_seconds() if self.task.expires_at else None
            )
            if remaining is not None and remaining <= 0:
                raise McpError(
                    INTERNAL_ERROR, f"No response to {method} before the task's ttl ran out ({self.task.ttl_ms} ms)"
                )
            row = await _db(lambda: TaskMessage.objects.filter(pk=msg.pk).values("response", "answered_at").first())()
            if row is None:
                raise ToolCancelled("the task's pending requests were dropped")
            if row["answered_at"] is not None:
                response = row["response"] or {}
                if "error" in response:
                    raise McpError.from_error(response["error"])
                return dict(response.get("result") or {})
            wait = poll if remaining is None else max(0.01, min(poll, remaining))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.answered.wait(), timeout=wait)
            self.answered.clear()


class Worker:
    """Runs tools for tasks and plain requests; one instance per worker process (or embedded)."""

    def __init__(
        self,
        *,
        concurrency: int | None = None,
        worker_id: str | None = None,
        registry_: Registry | None = None,
        run_cleanup: bool = True,
        burst: bool = False,
        max_tasks: int | None = None,
    ) -> None:
        s = conf.get()
        #: Stop once nothing is runnable and nothing runs (``--burst``).
        self.burst = burst
        #: Stop after starting this many runs, once they end (``--max-tasks``).
        self.max_tasks = max_tasks
        self.started = 0
        self.concurrency = concurrency or s.WORKER_CONCURRENCY
        self.worker_id = worker_id or f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(3)}"
        self.registry = registry_ or registry
        self.running: dict[str, tuple[asyncio.Task[Any], WorkerBackend, int]] = {}
        self.wake = asyncio.Event()
        self.stopping = False
        self.run_cleanup = run_cleanup
        self.channel: str | None = None
        #: Set when a handed-back sync tool may still be running in a thread at exit.
        self.abandoned_threads = False
        #: Runs handed back at shutdown (released leases), for whoever reports the shutdown.
        self.handed_back_total = 0
        self._layer = get_channel_layer()
        self._last_cleanup = 0.0
        self._last_reap = 0.0
        self._bg: set[asyncio.Future[Any]] = set()
        #: Outcomes waiting for the batch writer, and the writer while it runs.
        self._outcomes: list[tuple[Task, Outcome, asyncio.Future[bool]]] = []
        self._writer: asyncio.Future[None] | None = None
        #: Sync tools run here (never in the default executor, which others share).
        self.tool_executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="mcptasks-tool")
        self._lease = _LeaseThread()
        self._housekeeping = _LeaseThread()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rejoining: asyncio.Future[Any] | None = None
        #: The webhook delivery loop while :meth:`run` runs.
        self._webhooks: webhooks.WebhookSender | None = None
        self._joined_at = 0.0

    # --- lifecycle -----------------------------------------------------------------------------

    def _free_slots(self) -> int:
        """Runs this worker may start: ``concurrency`` minus the runs not waiting for a client,
        and never more than ``WAITING_FACTOR`` times ``concurrency`` runs in all."""
        busy = sum(1 for _t, backend, _a in self.running.values() if not backend.awaiting_client)
        return min(self.concurrency - busy, self.concurrency * WAITING_FACTOR - len(self.running))

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Claim and run tasks until ``stop`` is set, then drain within the shutdown grace."""
        stop = stop or asyncio.Event()
        s = conf.get()
        await self._heartbeat_row()
        listener = asyncio.ensure_future(self._listen())
        heart = asyncio.ensure_future(self._heartbeat_loop())
        sealer = asyncio.ensure_future(self._seal_loop()) if self.run_cleanup else None
        # Webhook deliveries go out from every worker (rows are claimed, so workers share them).
        sender = self._webhooks = webhooks.WebhookSender(worker_id=self.worker_id)
        hooks = asyncio.ensure_future(sender.run())
        logger.info("worker %s started (concurrency %d)", self.worker_id, self.concurrency)
        try:
            while not stop.is_set():
                # Clear before claiming: a wake-up that arrives during the claim is kept.
                self.wake.clear()
                try:
                    await self._maybe_cleanup()
                    await self._maybe_reap()
                    free = self._free_slots()
                    if self.max_tasks is not None:
                        free = min(free, self.max_tasks - self.started)
                    claimed = await _db(self._claim)(
                        free, running=list(self.running), tenant_running=self._busy_by_tenant()
                    ) if free > 0 else []
                    for task in claimed:
                        self._start(task)
                    if self._finished_its_work(claimed):
                        break
                except Exception:
                    logger.warning("claim loop failed; retrying after the poll interval", exc_info=True)
                waiters = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stop.wait())]
                await asyncio.wait(waiters, timeout=s.WORKER_POLL_S, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
        finally:
            self.stopping = True
            try:
                await self._heartbeat_row()
                await self._drain(s.WORKER_SHUTDOWN_GRACE_S)
            finally:
                heart.cancel()
                listener.cancel()
                hooks.cancel()
                sender.shutdown()
                if sealer is not None:
                    sealer.cancel()
                    with contextlib.suppress(Exception):
                        # What this worker's runs appended is chained before it exits.
                        await self._housekeeping(audit.housekeep)()
                await _db(services.worker_gone)(worker_id=self.worker_id)
                # Abandoned sync tools (handed back) may still run: don't wait for them.
                self.tool_executor.shutdown(wait=False, cancel_futures=True)
                self._lease.shutdown()
                self._housekeeping.shutdown()
                logger.info("worker %s stopped", self.worker_id)

    def _finished_its_work(self, claimed: list[Task]) -> bool:
        if self.running or self._outcomes:
            return False
        if self.max_tasks is not None and self.started >= self.max_tasks:
            return True
        return self.burst and not claimed

    async def _drain(self, grace: float) -> None:
        """Let running tools finish within ``grace``; hand the rest back."""
        if not self.running:
            return
        logger.info("worker %s draining %d running tasks (grace %gs)", self.worker_id, len(self.running), grace)
        _done, pending = await asyncio.wait([t for t, _b, _a in self.running.values()], timeout=grace)
        handed: list[tuple[str, int]] = []
        for task_id, (atask, backend, attempt) in list(self.running.items()):
            if atask not in pending:
                continue
            # Whatever the interrupted run does from now on is discarded (ctx.cancelled is True).
            backend.handed_back = True
            backend.cancel_flag = True
            backend.answered.set()
            tool = self.registry.get_tool(backend.task.tool_name)
            if tool is not None and not tool.is_async:
                self.abandoned_threads = True
            atask.cancel()
            handed.append((task_id, attempt))
        if pending:
            await asyncio.wait(pending, timeout=2)
        if handed:
            n = await _db(self._release)(handed)
            self.handed_back_total += n
            logger.info("worker %s handed back %d tasks", self.worker_id, n)

    def _release(self, handed: list[tuple[str, int]]) -> int:
        """Release our leases at once; the interrupted attempt does not count against the limit."""
        n = Task.objects.hand_back(worker_id=self.worker_id, runs=handed)
        if n:
            bus.wake_workers()
        return n

    async def _join_groups(self) -> bool:
        """(Re)join the wake-up group and the groups of our running tasks; False if Redis fails.

        Needed after any layer failure: a Redis that restarted empty has forgotten every
        membership, and without the wake-up group claims would wait for the poll backstop.
        """
        layer = self._layer
        if layer is None or self.channel is None:
            return True
        timeout = max(1.0, conf.get().LAYER_SEND_TIMEOUT_S)
        try:
            for group in [bus.WORKERS_GROUP, *(bus.task_group(t) for t in list(self.running))]:
                await asyncio.wait_for(layer.group_add(group, self.channel), timeout=timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.debug("worker could not join its groups: %s", type(exc).__name__)
            return False
        self._joined_at = asyncio.get_running_loop().time()
        return True

    def layer_failed(self) -> None:
        """The channel layer failed in this process (any thread): rejoin once Redis answers."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._start_rejoin)

    def _start_rejoin(self) -> None:
        if self._rejoining is None or self._rejoining.done():
            self._rejoining = asyncio.ensure_future(self._rejoin_loop())

    async def _rejoin_loop(self) -> None:
        poll = conf.get().LAYER_FALLBACK_POLL_S
        while True:
            await asyncio.sleep(poll)
            if await self._join_groups():
                logger.info("worker %s rejoined its channel-layer groups", self.worker_id)
                layers.send_breaker.succeeded()
                self.wake.set()  # claim whatever a lost wake-up announced
                return

    async def _listen(self) -> None:
        layer = self._layer
        if layer is None:
            return
        self._loop = asyncio.get_running_loop()
        self.channel = await layer.new_channel()
        layers.add_listener(self)
        if not await self._join_groups():
            self.layer_failed()
        try:
            await self._receive_loop(layer)
        finally:
            layers.remove_listener(self)
            if self._rejoining is not None:
                self._rejoining.cancel()

    async def _receive_loop(self, layer: Any) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if loop.time() - self._joined_at > GROUP_REFRESH_S:
                # Memberships expire after the layer's group_expiry: refresh them well before.
                await self._join_groups()
            try:
                msg = await layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # One warning per outage (the breaker logs it too), not one per failed receive.
                log = logger.debug if layers.send_breaker.is_open else logger.warning
                log("worker channel receive failed (%s); rejoining when Redis answers", type(exc).__name__)
                layers.report_failure(exc, open_s=tenants_conf.get().REDIS_BREAKER_S)
                self.layer_failed()
                await asyncio.sleep(conf.get().LAYER_FALLBACK_POLL_S)
                continue
            kind = msg.get("type")
            if kind == "worker.wake":
                self.wake.set()
            elif kind == "task.signal":
                entry = self.running.get(msg.get("task_id", ""))
                if entry is None:
                    continue
                _atask, backend, _attempt = entry
                event = msg.get("event")
                if event == "answer":
                    backend.answered.set()
                elif backend.finishing:
                    # The tool has returned; the run's own terminal "changed" signal (or a cancel
                    # racing the outcome) has nothing left to stop. Checking cost a database read
                    # per finished task and logged every completed task as "cancelled or superseded".
                    continue
                elif event == "cancel" or (event == "changed" and msg.get("status") not in LIVE):
                    # Our own progress/status updates also signal "changed": only a terminal
                    # status is worth a database read.
                    try:
                        await self._check_cancel(msg["task_id"])
                    except Exception:
                        logger.warning("cancel check failed", exc_info=True)

    async def _seal_loop(self) -> None:
        """Chain new audit events (in a thread of its own: never queued behind tools or leases)."""
        while True:
            await asyncio.sleep(conf.get().AUDIT_SEAL_INTERVAL_S)
            try:
                await self._housekeeping(audit.housekeep)()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("sealing the audit log failed", exc_info=True)

    async def _heartbeat_row(self) -> None:
        await self._lease(services.worker_heartbeat)(
            worker_id=self.worker_id, hostname=socket.gethostname(), pid=os.getpid(),
            concurrency=self.concurrency, running=len(self.running), stopping=self.stopping,
            rss_bytes=resident_memory_bytes(), asyncio_tasks=len(asyncio.all_tasks()),
        )

    async def _heartbeat_loop(self) -> None:
        s = conf.get()
        while True:
            await asyncio.sleep(s.WORKER_HEARTBEAT_S)
            try:
                await self._heartbeat_row()
                entries = {task_id: attempt for task_id, (_t, _b, attempt) in self.running.items()}
                if entries:
                    for task_id in await self._lease(self._renew)(entries):
                        await self._cancel_local(task_id)
                await self._maybe_reap()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("heartbeat failed", exc_info=True)

    def _renew(self, entries: dict[str, int]) -> list[str]:
        """Extend every lease we hold in one UPDATE; return the tasks we must stop."""
        lease = timezone.now() + dt.timedelta(seconds=conf.get().WORKER_LEASE_S)
        return Task.objects.renew(worker_id=self.worker_id, runs=entries, lease_until=lease)

    async def _check_cancel(self, task_id: str) -> None:
        entry = self.running.get(task_id)
        if entry is None:
            return
        attempt = entry[2]
        if not await _db(Task.objects.is_current_run)(task_id=task_id, attempt=attempt):
            await self._cancel_local(task_id)

    async def _cancel_local(self, task_id: str) -> None:
        """Stop a run: async tools are cancelled, sync tools see ``ctx.cancelled``."""
        entry = self.running.get(task_id)
        if entry is None:
            return
        atask, backend, _attempt = entry
        if backend.cancel_flag:
            return
        backend.cancel_flag = True
        backend.answered.set()
        tool = self.registry.get_tool(backend.task.tool_name)
        if tool is not None and tool.is_async:
            atask.cancel()
        logger.info("task %s stopped in worker %s (cancelled or superseded)", task_id, self.worker_id)

    # --- claiming ------------------------------------------------------------------------------

    def _claim(self, limit: int, *, running: list[str] | None = None,
               tenant_running: dict[int, int] | None = None) -> list[Task]:
        """Take up to ``limit`` runnable tasks in one short transaction (see ``TaskQuerySet.claim``).

        From the event loop, pass ``running`` and ``tenant_running`` taken there: this runs in the
        database thread, and reading ``self.running`` here while the loop starts and ends runs
        raised "dictionary changed size during iteration" (a skipped claim round, seen in the soak).
        """
        now = timezone.now()
        return Task.objects.claim(
            worker_id=self.worker_id, limit=limit, now=now,
            lease_until=now + dt.timedelta(seconds=conf.get().WORKER_LEASE_S),
            exclude=list(self.running) if running is None else running,
            limited={t.name: t.max_concurrency for t in self.registry.tools.values() if t.max_concurrency},
            tenant_running=self._busy_by_tenant() if tenant_running is None else tenant_running,
            tenant_cap=self._tenant_cap(),
        )

    def _busy_by_tenant(self) -> dict[int, int]:
        """This worker's runs per tenant, not counting those waiting for their client."""
        busy: dict[int, int] = {}
        for _t, backend, _a in self.running.values():
            if backend is not None and not backend.awaiting_client:
                busy[backend.task.tenant_id] = busy.get(backend.task.tenant_id, 0) + 1
        return busy

    def _tenant_cap(self) -> int | None:
        """Most runs one tenant may have here: ``concurrency`` less the reserved slots (at least 1).

        The reserved slots stay free for other tenants however many tasks one tenant queues,
        so another tenant's task starts at once instead of waiting for a flood of long runs.
        """
        reserved = conf.get().WORKER_TENANT_RESERVED_SLOTS
        return max(1, self.concurrency - reserved) if reserved > 0 else None

    async def _maybe_reap(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_reap < conf.get().WORKER_HEARTBEAT_S:
            return
        self._last_reap = loop.time()
        await _db(self._reap_lost)()

    def _reap_lost(self) -> int:
        """Fail tasks whose last allowed attempt lost its worker (lease expired).

        The row is first taken over with a conditional UPDATE (lease still expired, same
        attempt), so a worker that was only slow and renews concurrently is told to stop
        instead of racing us; then the failure is written ``WHERE attempt = <that attempt>``.
        """
        now = timezone.now()
        lease = now + dt.timedelta(seconds=conf.get().WORKER_LEASE_S)
        failed = 0
        for task in Task.objects.take_over_lost(reaper_id=f"reaper:{self.worker_id}", now=now, lease_until=lease):
            ok = services.transition(
                task=task, to=TaskStatus.FAILED, status_message=WORKER_LOST,
                error={"code": INTERNAL_ERROR, "message": WORKER_LOST}, attempt=task.attempt,
            )
            if ok:
                failed += 1
                logger.warning("task %s failed: %s (attempt %d)", task.task_id, WORKER_LOST, task.attempt)
        return failed

    # --- running -------------------------------------------------------------------------------

    def _start(self, task: Task) -> None:
        self.started += 1
        backend = WorkerBackend(self, task)
        atask = asyncio.ensure_future(self._execute(task, backend))
        self.running[task.task_id] = (atask, backend, task.attempt)
        if self._layer is not None and self.channel is not None:
            self._background(self._layer.group_add(bus.task_group(task.task_id), self.channel))

        def done(_f: asyncio.Future[Any]) -> None:
            entry = self.running.get(task.task_id)
            if entry is not None and entry[0] is atask:
                self.running.pop(task.task_id, None)
            if self._layer is not None and self.channel is not None and not self.stopping:
                self._background(self._layer.group_discard(bus.task_group(task.task_id), self.channel))
            self.wake.set()

        atask.add_done_callback(done)

    def _background(self, coro: Any) -> None:
        # Keep a reference until done (the loop holds only weak references to tasks).
        fut = asyncio.ensure_future(self._layer_op(coro))
        self._bg.add(fut)
        fut.add_done_callback(self._bg.discard)

    async def _layer_op(self, coro: Any) -> None:
        """Await a fire-and-forget layer call (a group join or leave) and handle its failure.

        Unawaited, a failing call left "Task exception was never retrieved" on every run start and
        end while Redis failed over (thousands of lines a minute). A failure opens the layer's
        breaker (one warning per outage) and makes the worker rejoin its groups once Redis answers.
        """
        try:
            await asyncio.wait_for(coro, timeout=max(1.0, conf.get().LAYER_SEND_TIMEOUT_S))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            layers.report_failure(exc, open_s=tenants_conf.get().REDIS_BREAKER_S)

    async def _execute(self, task: Task, backend: WorkerBackend) -> None:
        # The run's log lines name its task; its spans join the trace of the request that created it.
        with observability.task_run(task, worker_id=self.worker_id):
            outcome = await self._run(task, backend)
            if outcome is not None:
                backend.finishing = True
                try:
                    # The latest progress held back by the rate limit goes out before the outcome.
                    await backend.flush_progress()
                except Exception:
                    logger.warning("sending the last progress of task %s failed", task.task_id, exc_info=True)
                with observability.span("mcptasks.task.notify", task=task, **{"mcptasks.status": outcome.status}):
                    await self._finish(task, outcome)
            elif backend._progress_timer is not None:
                backend._progress_timer.cancel()

    async def _run(self, task: Task, backend: WorkerBackend) -> Outcome | None:
        """Run the tool; how the run ended (None: nothing to write: cancelled, superseded, handed back)."""
        tool = self.registry.get_tool(task.tool_name)
        if tool is None:
            msg = f"Unknown tool: {task.tool_name}"
            return _outcome(task, TaskStatus.FAILED, msg, error={"code": INTERNAL_ERROR, "message": msg})
        await backend.load()
        ctx = ToolContext(
            backend, task_id=task.task_id if task.kind == Task.Kind.TASK else None,
            request_id=task.request_id, session_id=task.session_id, attempt=task.attempt,
            tenant=getattr(task, "tenant_slug", None), principal=getattr(task, "principal_ident", None),
        )
        timeout_cm: asyncio.Timeout | None = None
        # A tool that declares no limit gets the default one: no run holds a slot forever.
        limit_s = tool.timeout_s if tool.timeout_s is not None else (conf.get().TOOL_DEFAULT_TIMEOUT_S or None)
        try:
            arguments = tool.validate_arguments((task.params or {}).get("arguments"))
            async with asyncio.timeout(limit_s) as timeout_cm:
                result = await tool.invoke(arguments, ctx, executor=self.tool_executor)
        except ToolInputError as exc:
            return _outcome(task, TaskStatus.FAILED, str(exc),
                            result={"content": [{"type": "text", "text": str(exc)}], "isError": True})
        except TimeoutError:
            if backend.cancel_flag:
                return None
            if timeout_cm is not None and timeout_cm.expired():
                backend.cancel_flag = True  # a sync tool still in its thread sees ctx.cancelled
                msg = f"Tool {tool.name} timed out after {limit_s:g}s"
            else:
                msg = "Tool execution failed: TimeoutError"
            return _outcome(task, TaskStatus.FAILED, msg, error={"code": INTERNAL_ERROR, "message": msg})
        except asyncio.CancelledError:
            if backend.cancel_flag or self.stopping:
                return None  # cancelled, superseded or handed back: any late outcome is discarded
            raise
        except ToolCancelled as exc:
            if backend.cancel_flag or self.stopping or not await _db(backend._still_ours)():
                return None
            # The tool gave up on its own (e.g. its pending request vanished): a failure.
            msg = f"Tool execution failed: {exc}"
            return _outcome(task, TaskStatus.FAILED, msg, error={"code": INTERNAL_ERROR, "message": msg})
        except McpError as exc:
            if backend.cancel_flag:
                return None
            return _outcome(task, TaskStatus.FAILED, f"Tool execution failed: {exc.message}", error=exc.to_error())
        except Exception as exc:
            if backend.cancel_flag:
                return None
            logger.exception("tool %s crashed in task %s", tool.name, task.task_id)
            msg = f"Tool execution failed: {type(exc).__name__}: {exc}"
            if task.kind == Task.Kind.REQUEST:
                return _outcome(task, TaskStatus.FAILED, msg,
                                result={"content": [{"type": "text", "text": msg}], "isError": True})
            return _outcome(task, TaskStatus.FAILED, msg, error={"code": INTERNAL_ERROR, "message": msg})
        if backend.cancel_flag:
            return None
        if result.get("isError"):
            text = next((c.get("text") for c in result.get("content", []) if c.get("type") == "text"), None)
            return _outcome(task, TaskStatus.FAILED, f"Tool returned an error: {text or 'isError'}", result=result)
        return _outcome(task, TaskStatus.COMPLETED, None, result=result)

    async def _finish(self, task: Task, outcome: Outcome) -> None:
        """Write a run's outcome: queued to the batch writer, returns once it is committed."""
        problem = storable_problem(outcome.result)
        if problem is not None:
            # Checked before the write: an unstorable result fails the task at once with a clear
            # message, instead of raising inside the final write and waiting for the lease.
            logger.warning("task %s: tool %s returned a result that cannot be stored: %s",
                           task.task_id, task.tool_name, problem)
            message = f"Tool returned a result that cannot be stored: {problem}"
            outcome = _outcome(task, TaskStatus.FAILED, message, error={"code": INTERNAL_ERROR, "message": message})
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._outcomes.append((task, outcome, done))
        if self._writer is None or self._writer.done():
            # In a context of its own: the writer serves every run, not the one that started it
            # (whose task id and trace its log lines and spans would otherwise carry).
            self._writer = asyncio.get_running_loop().create_task(self._write_outcomes(), context=contextvars.Context())
        # Shielded: a run cancelled while its outcome is being written does not cancel the write.
        if not await asyncio.shield(done):
            logger.info("late outcome of task %s attempt %d discarded (no longer live or superseded)",
                        task.task_id, outcome.attempt)

    async def _write_outcomes(self) -> None:
        """Write queued outcomes, a batch per transaction, until the queue is empty.

        Outcomes that arrive while a batch is being written form the next batch, so a busy
        worker writes many per transaction and an idle one writes each at once.
        """
        while self._outcomes:
            batch, self._outcomes = self._outcomes[:FINISH_BATCH], self._outcomes[FINISH_BATCH:]
            try:
                written = await self._write_batch([(t, o) for t, o, _d in batch])
            except Exception as exc:
                logger.exception("writing %d outcomes failed", len(batch))
                for _t, _o, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for (_t, _o, done), ok in zip(batch, written, strict=True):
                if not done.done():
                    done.set_result(ok)
            if any(written) and self._webhooks is not None and _delivered(written):
                # The batch wrote webhook rows: look now instead of at the next poll (not after
                # every batch: with no endpoint that was a claim query per batch for nothing).
                self._webhooks.wake.set()

    async def _write_batch(self, runs: list[tuple[Task, Outcome]]) -> list[bool]:
        """Write outcomes, retrying through a database outage while the lease lasts.

        A tool that succeeded must not be reported lost (or re-run) because the database was
        briefly away when it finished: the write is retried with backoff for up to one lease
        (nobody else can claim the task before it lapses), each failure logged.
        """
        deadline = asyncio.get_running_loop().time() + conf.get().WORKER_LEASE_S
        delay = 0.2
        while True:
            try:
                # As returned: a services.Finished also says whether webhook rows were written.
                return await _db(services.finish_runs)(runs=runs)
            except (OperationalError, InterfaceError) as exc:
                if asyncio.get_running_loop().time() + delay > deadline:
                    logger.error("giving up writing %d outcomes (%s); their leases will lapse",
                                 len(runs), type(exc).__name__)
                    return [False] * len(runs)
                logger.warning("database unavailable writing %d outcomes (%s); retrying in %.1f s",
                               len(runs), type(exc).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _maybe_cleanup(self) -> None:
        if not self.run_cleanup:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_cleanup < conf.get().CLEANUP_INTERVAL_S:
            return
        self._last_cleanup = loop.time()
        try:
            await _db(services.cleanup_expired)()
        except Exception:
            logger.warning("periodic cleanup failed", exc_info=True)
