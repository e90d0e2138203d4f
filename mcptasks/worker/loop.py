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
import logging
import os
import secrets
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.layers import get_channel_layer
from django.db import connection

from mcptasks import conf, observability
from mcptasks.audit import housekeeping as audit_housekeeping
from mcptasks.db import wakeups
from mcptasks.models import Claimed, Outcome, Task
from mcptasks.streams import webhooks
from mcptasks.tasks import runs
from mcptasks.tools.registry import Registry, registry
from mcptasks.worker import rows
from mcptasks.worker.backend import WorkerBackend, run_tool
from mcptasks.worker.dbthread import LeaseThread, db
from mcptasks.worker.draining import Draining
from mcptasks.worker.housekeeping import Housekeeping
from mcptasks.worker.membership import ChannelMembership
from mcptasks.worker.outcomes import OutcomeWriting
from mcptasks.worker.wakeup_optin import WakeupOptIn

logger = logging.getLogger(__name__)

#: A worker holds at most this many times its concurrency in runs, counting those that wait
#: for their client (which do not count against the concurrency itself).
WAITING_FACTOR = 4


def _holds_slot(backend: WorkerBackend) -> bool:
    """Whether a run counts against the worker's concurrency: its tool runs, not waiting for
    the client and not yet returned.

    A run whose tool returned only waits for the batch writer: holding its slot until the
    outcome and its notifications were written kept slots idle for 3-5 times the run of a
    50 ms tool under load, while tasks waited to be claimed (bench/RESULTS.md, issue 27).
    """
    return not backend.awaiting_client and not backend.finishing


def _tenant_cap(concurrency: int) -> int | None:
    """Most runs one tenant may have in a worker: ``concurrency`` less the reserved slots (at least 1).

    The reserved slots stay free for other tenants however many tasks one tenant queues,
    so another tenant's task starts at once instead of waiting for a flood of long runs.
    """
    reserved = conf.get().WORKER_TENANT_RESERVED_SLOTS
    return max(1, concurrency - reserved) if reserved > 0 else None


def tasks_may_wait(*, asked: int, claimed: Claimed, busy: dict[int, int], cap: int | None) -> bool:
    """After a claim round that asked for ``asked`` tasks and got ``claimed``: may runnable tasks
    still wait that no wake-up will announce? ``busy``: the worker's runs per tenant, ``cap``: its
    tenant cap (:func:`_tenant_cap`).

    A claim that passed over rows it saw (:class:`~mcptasks.models.Claimed`) left them behind:
    a concurrent claim held them, and it locks every row it ranks but keeps only its share. With
    slots still free the worker then claims again after the claim delay, until a claim passes
    over nothing (a worker that took a short claim for an empty queue idled until its poll while
    thousands of tasks waited).

    A created task wakes every worker (``NOTIFY`` or the channel layer), so a claim that found
    fewer tasks than it asked for, and passed over none, left none behind, and the next run whose
    tool returns need not claim: at one task at a time that claim found nothing, one wasted claim statement per task in
    every worker (issue 27; profile in ``bench/RESULTS.md``). Tasks may wait unannounced when the
    round filled every slot it asked for (or could ask for none), or when a tenant is at its cap
    here. A task of a tool at its ``max_concurrency`` is claimed when a run of that tool ends (see
    ``Worker._start``). Tasks that become runnable later (a retry's delay, a lapsed lease) are
    found by the poll every ``WORKER_POLL_S``, as before.
    """
    return (claimed.passed_over or asked <= 0 or len(claimed) >= asked
            or (cap is not None and any(n >= cap for n in busy.values())))


class Debounced:
    """``fire`` once, ``delay`` seconds after the first of a burst of calls (at once if ``delay`` is
    not positive). Called and fired on the running event loop."""

    def __init__(self, fire: Callable[[], Any], delay: float) -> None:
        self.fire, self.delay = fire, delay
        self._pending: asyncio.TimerHandle | None = None

    def __call__(self) -> None:
        if self.delay <= 0:
            self.fire()
        elif self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(self.delay, self._fire)

    def _fire(self) -> None:
        self._pending = None
        self.fire()

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


def _most(before: dict[int, int], after: dict[int, int]) -> dict[int, int]:
    """Each tenant's runs, the more of ``before`` a claim and ``after`` it (with the runs it took)."""
    return {t: max(before.get(t, 0), after.get(t, 0)) for t in before.keys() | after.keys()}


class Worker(ChannelMembership, Housekeeping, OutcomeWriting, WakeupOptIn, Draining):
    """Runs tools for tasks and plain requests; one instance per worker process (or embedded).

    This class is the claim/run loop; its channel-layer membership, housekeeping and outcome
    writing are the mixins of :mod:`~mcptasks.worker.membership`,
    :mod:`~mcptasks.worker.housekeeping` and :mod:`~mcptasks.worker.outcomes`. It holds no
    queries: the task store is changed through :mod:`mcptasks.tasks`.
    """

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
        #: Told of new tasks (NOTIFY, the channel layer): claims after ``WORKER_CLAIM_DELAY_S``.
        self.announce: Debounced = Debounced(self.wake.set, s.WORKER_CLAIM_DELAY_S)
        self.stopping = False
        self.run_cleanup = run_cleanup
        self.channel: str | None = None
        #: Whether a handed-back sync tool may still run in a thread at exit; runs handed back at shutdown.
        self.abandoned_threads, self.handed_back_total = False, 0
        self._layer = get_channel_layer()
        self._last_cleanup = 0.0
        self._last_reap = 0.0
        self._outcomes: list[tuple[Task, Outcome, asyncio.Future[bool]]] = []  # for the batch writer
        self._writer: asyncio.Future[None] | None = None
        #: Sync tools run here (never in the default executor, which others share).
        self.tool_executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="mcptasks-tool")
        self._lease = LeaseThread()
        self._housekeeping = LeaseThread()
        #: On PostgreSQL claims have a thread and connection of their own, not queued behind outcome
        #: batches (issue 27); SQLite serialises writers anyway, so they stay in the database thread.
        self._claimer = LeaseThread() if connection.vendor == "postgresql" else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rejoining: asyncio.Future[Any] | None = None
        #: The webhook delivery loop while :meth:`run` runs.
        self._webhooks: webhooks.WebhookSender | None = None
        self._joined_at = 0.0
        #: :func:`tasks_may_wait` after the last claim: only then does a returned run claim at once.
        self._backlog = True
        self._wants_wakeups: bool | None = None  # see WakeupOptIn
        self._backlog_since: float | None = None

    def _free_slots(self) -> int:
        """Runs it may start: ``concurrency`` less those holding a slot, at most ``WAITING_FACTOR`` times it in all."""
        busy = sum(1 for _t, backend, _a in self.running.values() if _holds_slot(backend))
        return min(self.concurrency - busy, self.concurrency * WAITING_FACTOR - len(self.running))

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Claim and run tasks until ``stop`` is set, then drain within the shutdown grace."""
        stop = stop or asyncio.Event()
        s = conf.get()
        await self._heartbeat_row()
        listener = asyncio.ensure_future(self._listen())
        # Tasks created in one statement wake us through PostgreSQL (see mcptasks.db.wakeups).
        notified = asyncio.ensure_future(wakeups.listen(self.announce)) if wakeups.via_postgres() else None
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
                    free = min(self._free_slots(), self.max_tasks - self.started if self.max_tasks else 1 << 30)
                    # The runs per tenant the claim counts against the cap: a tenant at its cap
                    # then is still capped when its runs return during the claim (read only
                    # after it, it looked uncapped, and its backlog like an empty queue).
                    busy = self._busy_by_tenant()
                    claimed = await (self._claimer or db)(self._claim)(
                        free, running=list(self.running), tenant_running=busy
                    ) if free > 0 else Claimed()
                    for task in claimed:
                        self._start(task)
                    self._backlog = tasks_may_wait(asked=free, claimed=claimed, cap=_tenant_cap(self.concurrency),
                                                   busy=_most(busy, self._busy_by_tenant()))
                    if claimed.passed_over and len(claimed) < free:  # look again soon (tasks_may_wait)
                        self.announce()
                    if notified is not None:
                        await self._want_wakeups()
                    if self._finished_its_work(claimed):
                        break
                except Exception:
                    self._backlog = True
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
                self.announce.cancel()
                listener.cancel()
                if notified is not None:
                    notified.cancel()
                hooks.cancel()
                sender.shutdown()
                if sealer is not None:
                    sealer.cancel()
                    with contextlib.suppress(Exception):
                        # What this worker's runs appended is chained before it exits.
                        await self._housekeeping(audit_housekeeping.housekeep)()
                await db(rows.worker_gone)(worker_id=self.worker_id)
                # Abandoned sync tools (handed back) may still run: don't wait for them.
                self.tool_executor.shutdown(wait=False, cancel_futures=True)
                self._lease.shutdown()
                if self._claimer is not None:
                    self._claimer.shutdown()
                self._housekeeping.shutdown()
                logger.info("worker %s stopped", self.worker_id)

    def _finished_its_work(self, claimed: Claimed) -> bool:
        if self.running or self._outcomes:
            return False
        if self.max_tasks is not None and self.started >= self.max_tasks:
            return True
        return self.burst and not claimed and not claimed.passed_over  # rows held by another claim remain

    def _claim(self, limit: int, *, running: list[str] | None = None,
               tenant_running: dict[int, int] | None = None) -> Claimed:
        """Take up to ``limit`` runnable tasks in one short transaction (see ``TaskQuerySet.claim``).

        Pass ``running`` and ``tenant_running`` taken on the event loop: read in the database
        thread, ``self.running`` changed size during iteration (a skipped claim round, in the soak).
        """
        return runs.claim_runs(
            worker_id=self.worker_id, limit=limit,
            exclude=list(self.running) if running is None else running,
            limited={t.name: t.max_concurrency for t in self.registry.tools.values() if t.max_concurrency},
            tenant_running=self._busy_by_tenant() if tenant_running is None else tenant_running,
            tenant_cap=_tenant_cap(self.concurrency),
        )

    def _busy_by_tenant(self) -> dict[int, int]:
        """This worker's runs per tenant, not counting those waiting for their client."""
        busy: dict[int, int] = {}
        for _t, backend, _a in self.running.values():
            if backend is not None and _holds_slot(backend):
                busy[backend.task.tenant_id] = busy.get(backend.task.tenant_id, 0) + 1
        return busy

    def _start(self, task: Task) -> None:
        self.started += 1
        backend = WorkerBackend(self, task)
        limited = bool(getattr(self.registry.get_tool(task.tool_name), "max_concurrency", None))
        atask = asyncio.ensure_future(self._execute(task, backend))
        self.running[task.task_id] = (atask, backend, task.attempt)

        def done(_f: asyncio.Future[Any]) -> None:
            capped = len(self.running) >= self.concurrency * WAITING_FACTOR
            entry = self.running.get(task.task_id)
            if entry is not None and entry[0] is atask:
                self.running.pop(task.task_id, None)
            # A returned run freed its slot when its tool returned: its end frees nothing more
            # unless the cap on all runs was the limit, its tool has a max_concurrency (counted
            # until the outcome is written), or a burst or max-tasks worker may now be done.
            if not backend.finishing or capped or limited or (
                    not self.running and (self.burst or self.max_tasks is not None)):
                self.wake.set()

        atask.add_done_callback(done)

    async def _execute(self, task: Task, backend: WorkerBackend) -> None:
        # The run's log lines name its task; its spans join the trace of the request that created it.
        with observability.task_run(task, worker_id=self.worker_id):
            outcome = await self._run(task, backend)
            if outcome is not None:
                backend.finishing = True
                if self._backlog:
                    self.wake.set()  # its slot is free: claim the next task while this one is written
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
        return await run_tool(self, task, backend)

    async def _check_cancel(self, task_id: str) -> None:
        entry = self.running.get(task_id)
        if entry is None:
            return
        attempt = entry[2]
        if not await db(runs.is_current_run)(task_id=task_id, attempt=attempt):
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
