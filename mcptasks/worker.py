"""The worker: claims tasks with leases, runs tools, heartbeats, recovers from crashes.

Claiming is a short transaction (``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL) that
stamps the attempt number, the worker id and a lease; the tool runs outside it. A heartbeat
renews the lease and reads the cancel flag. When a worker dies, its leases lapse and another
worker either re-runs the task (retryable tools, up to ``max_attempts``) or fails it with
"worker lost during execution". Every outcome is written with ``WHERE attempt = <ours>`` so a
superseded run can never overwrite the task.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import secrets
import socket
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import close_old_connections, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from . import bus, conf, services
from .context import ToolCancelled, ToolContext
from .models import McpSession, Task, TaskMessage, TaskStatus, WorkerHeartbeat
from .protocol.errors import CAPABILITY_MISSING, INTERNAL_ERROR, McpError
from .protocol.messages import related_task_meta
from .registry import Registry, ToolInputError, registry

logger = logging.getLogger(__name__)

WORKER_LOST = "worker lost during execution"


def _db(fn: Any) -> Any:
    """Run ORM code in a worker thread, dropping stale connections first (like Channels does)."""

    def inner(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(inner, thread_sensitive=True)


class WorkerBackend:
    """The :class:`ToolContext` backend for a tool running in this worker."""

    def __init__(self, worker: Worker, task: Task) -> None:
        self.worker = worker
        self.task = task
        self.cancel_flag = False
        self.answered = asyncio.Event()
        self._capabilities: dict[str, Any] | None = None
        self._last_progress: float | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancel_flag

    async def _session(self) -> McpSession | None:
        return await _db(lambda: McpSession.objects.filter(pk=self.task.session_id).first())()  # type: ignore[no-any-return]

    def client_supports(self, capability: str) -> bool:
        return capability in (self._capabilities or {})

    async def load(self) -> None:
        session = await self._session()
        self._capabilities = dict(session.client_capabilities) if session else {}

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        token = self.task.progress_token
        if token is None or self.cancel_flag:
            return
        params: dict[str, Any] = {"progressToken": token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        if self.task.kind == Task.Kind.TASK:
            params["_meta"] = related_task_meta(self.task.task_id)
        await _db(services.publish_for_task)(
            task=self.task, message={"jsonrpc": "2.0", "method": "notifications/progress", "params": params}
        )

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
        await _db(services.set_status_message)(task=self.task, message=message)

    async def close_stream(self) -> None:
        """Close the client's connection to a plain request's POST stream (it resumes by GET)."""
        if self.task.kind == Task.Kind.REQUEST and self.task.stream_id:
            await _db(bus.publish)(session_id=self.task.session_id, stream_id=self.task.stream_id,
                                   message={"_close": True})

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        capability = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling"}.get(method)
        if capability and not self.client_supports(capability):
            raise McpError(CAPABILITY_MISSING, f"The client did not declare the {capability} capability")
        self.answered.clear()
        msg = await _db(services.add_task_message)(task=self.task, method=method, params=params)
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
            try:
                wait = poll if remaining is None else max(0.01, min(poll, remaining))
                await asyncio.wait_for(self.answered.wait(), timeout=wait)
            except TimeoutError:
                pass
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
    ) -> None:
        s = conf.get()
        self.concurrency = concurrency or s.WORKER_CONCURRENCY
        self.worker_id = worker_id or f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(3)}"
        self.registry = registry_ or registry
        self.running: dict[str, tuple[asyncio.Task[Any], WorkerBackend, int]] = {}
        self.wake = asyncio.Event()
        self.stopping = False
        self.run_cleanup = run_cleanup
        self.channel: str | None = None
        self._layer = get_channel_layer()
        self._last_cleanup = 0.0

    # --- lifecycle -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Claim and run tasks until ``stop`` is set, then drain within the shutdown grace."""
        stop = stop or asyncio.Event()
        s = conf.get()
        await self._heartbeat_row()
        listener = asyncio.ensure_future(self._listen())
        heart = asyncio.ensure_future(self._heartbeat_loop())
        logger.info("worker %s started (concurrency %d)", self.worker_id, self.concurrency)
        try:
            while not stop.is_set():
                await self._maybe_cleanup()
                free = self.concurrency - len(self.running)
                claimed: list[Task] = []
                if free > 0:
                    await _db(self._reap_lost)()
                    claimed = await _db(self._claim)(free)
                    for task in claimed:
                        self._start(task)
                if claimed and len(self.running) < self.concurrency:
                    continue  # there may be more waiting
                self.wake.clear()
                waiters = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stop.wait())]
                await asyncio.wait(waiters, timeout=s.WORKER_POLL_S, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
        finally:
            self.stopping = True
            await self._drain(s.WORKER_SHUTDOWN_GRACE_S)
            heart.cancel()
            listener.cancel()
            await _db(WorkerHeartbeat.objects.filter(worker_id=self.worker_id).delete)()
            logger.info("worker %s stopped", self.worker_id)

    async def _drain(self, grace: float) -> None:
        if not self.running:
            return
        tasks = [t for t, _b, _a in self.running.values()]
        done, pending = await asyncio.wait(tasks, timeout=grace)
        for task_id, (atask, _backend, attempt) in list(self.running.items()):
            if atask in pending:
                atask.cancel()
                # Hand the task back: release the lease so another worker takes it at once.
                await _db(self._release)(task_id, attempt)
        if pending:
            await asyncio.wait(pending, timeout=5)

    def _release(self, task_id: str, attempt: int) -> None:
        Task.objects.filter(task_id=task_id, attempt=attempt, worker_id=self.worker_id).exclude(
            status__in=[TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED]
        ).update(lease_expires_at=None, worker_id=None, attempt=attempt - 1)
        bus.wake_workers()

    async def _listen(self) -> None:
        layer = self._layer
        if layer is None:
            return
        self.channel = await layer.new_channel()
        await layer.group_add(bus.WORKERS_GROUP, self.channel)
        while True:
            try:
                msg = await layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("worker channel receive failed", exc_info=True)
                await asyncio.sleep(1)
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
                elif event in ("cancel", "changed"):
                    await self._check_cancel(msg["task_id"])

    async def _heartbeat_row(self) -> None:
        await _db(services.worker_heartbeat)(
            worker_id=self.worker_id, hostname=socket.gethostname(), pid=os.getpid(),
            concurrency=self.concurrency, running=len(self.running), stopping=self.stopping,
        )

    async def _heartbeat_loop(self) -> None:
        s = conf.get()
        while True:
            await asyncio.sleep(s.WORKER_HEARTBEAT_S)
            try:
                await self._heartbeat_row()
                for task_id, (_atask, _backend, attempt) in list(self.running.items()):
                    alive = await _db(self._renew)(task_id, attempt)
                    if not alive:
                        await self._cancel_local(task_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("heartbeat failed", exc_info=True)

    def _renew(self, task_id: str, attempt: int) -> bool:
        """Extend our lease; False when the task was cancelled, finished or taken from us."""
        lease = timezone.now() + dt.timedelta(seconds=conf.get().WORKER_LEASE_S)
        n = Task.objects.filter(
            task_id=task_id, attempt=attempt, worker_id=self.worker_id, cancel_requested=False,
            status__in=[TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED],
        ).update(lease_expires_at=lease)
        return n == 1

    async def _check_cancel(self, task_id: str) -> None:
        entry = self.running.get(task_id)
        if entry is None:
            return
        row = await _db(lambda: Task.objects.filter(task_id=task_id).values("status", "cancel_requested").first())()
        if row is None or row["cancel_requested"] or row["status"] == TaskStatus.CANCELLED:
            await self._cancel_local(task_id)

    async def _cancel_local(self, task_id: str) -> None:
        entry = self.running.get(task_id)
        if entry is None:
            return
        atask, backend, _attempt = entry
        backend.cancel_flag = True
        backend.answered.set()
        tool = self.registry.get_tool(backend.task.tool_name)
        if tool is not None and tool.is_async:
            atask.cancel()

    # --- claiming ------------------------------------------------------------------------------

    def _claim(self, limit: int) -> list[Task]:
        now = timezone.now()
        lease = now + dt.timedelta(seconds=conf.get().WORKER_LEASE_S)
        with transaction.atomic():
            qs = (
                Task.objects.filter(status__in=[TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED], cancel_requested=False)
                .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
                .filter(attempt__lt=F("max_attempts"))
                .filter(Q(run_after__isnull=True) | Q(run_after__lte=now))
                .order_by("seq")
            )
            if connection.vendor == "postgresql":
                qs = qs.select_for_update(skip_locked=True)
            candidates = list(qs[: limit * 2])
            claimed: list[Task] = []
            for task in candidates:
                if len(claimed) >= limit:
                    break
                if task.attempt >= task.max_attempts:
                    continue  # the reaper fails it
                tool = self.registry.get_tool(task.tool_name)
                if tool is not None and tool.max_concurrency is not None and not self._tool_slot_free(tool.name,
                                                                                                      tool.max_concurrency, now):
                    continue
                n = Task.objects.filter(pk=task.pk, attempt=task.attempt).update(
                    attempt=task.attempt + 1, worker_id=self.worker_id, lease_expires_at=lease
                )
                if n:
                    task.attempt += 1
                    task.worker_id = self.worker_id
                    task.lease_expires_at = lease
                    claimed.append(task)
        return claimed

    @staticmethod
    def _tool_slot_free(tool_name: str, limit: int, now: dt.datetime) -> bool:
        running = Task.objects.filter(
            tool_name=tool_name, status__in=[TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED],
            lease_expires_at__gt=now,
        ).count()
        return running < limit

    def _reap_lost(self) -> None:
        """Fail tasks whose last allowed attempt lost its worker (lease expired)."""
        now = timezone.now()
        lost = list(
            Task.objects.filter(
                status__in=[TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED],
                lease_expires_at__lt=now,
                attempt__gte=1,
            ).filter(attempt__gte=F("max_attempts"))[:100]
        )
        for task in lost:
            ok = services.transition(
                task=task, to=TaskStatus.FAILED, status_message=WORKER_LOST,
                error={"code": INTERNAL_ERROR, "message": WORKER_LOST}, attempt=task.attempt,
            )
            if ok:
                logger.warning("task %s failed: %s (attempt %d)", task.task_id, WORKER_LOST, task.attempt)

    # --- running -------------------------------------------------------------------------------

    def _start(self, task: Task) -> None:
        backend = WorkerBackend(self, task)
        atask = asyncio.ensure_future(self._execute(task, backend))
        self.running[task.task_id] = (atask, backend, task.attempt)
        if self._layer is not None and self.channel is not None:
            asyncio.ensure_future(self._layer.group_add(bus.task_group(task.task_id), self.channel))

        def done(_f: asyncio.Future[Any]) -> None:
            self.running.pop(task.task_id, None)
            if self._layer is not None and self.channel is not None:
                asyncio.ensure_future(self._layer.group_discard(bus.task_group(task.task_id), self.channel))
            self.wake.set()

        atask.add_done_callback(done)

    async def _execute(self, task: Task, backend: WorkerBackend) -> None:
        tool = self.registry.get_tool(task.tool_name)
        attempt = task.attempt
        if tool is None:
            await self._finish(task, attempt, TaskStatus.FAILED, f"Unknown tool: {task.tool_name}", None,
                               {"code": INTERNAL_ERROR, "message": f"Unknown tool: {task.tool_name}"})
            return
        await backend.load()
        ctx = ToolContext(
            backend, task_id=task.task_id if task.kind == Task.Kind.TASK else None,
            request_id=task.request_id, session_id=task.session_id, attempt=attempt,
        )
        try:
            arguments = tool.validate_arguments((task.params or {}).get("arguments"))
            coro = tool.invoke(arguments, ctx)
            result = await (asyncio.wait_for(coro, tool.timeout_s) if tool.timeout_s else coro)
        except ToolInputError as exc:
            await self._finish(task, attempt, TaskStatus.FAILED, str(exc),
                               {"content": [{"type": "text", "text": str(exc)}], "isError": True}, None)
            return
        except TimeoutError:
            msg = f"Tool {tool.name} timed out after {tool.timeout_s:g}s"
            await self._finish(task, attempt, TaskStatus.FAILED, msg, None, {"code": INTERNAL_ERROR, "message": msg})
            return
        except (asyncio.CancelledError, ToolCancelled):
            if backend.cancel_flag or self.stopping:
                return  # the task is already cancelled (or handed back); its late outcome is discarded
            raise
        except McpError as exc:
            await self._finish(task, attempt, TaskStatus.FAILED, f"Tool execution failed: {exc.message}", None,
                               exc.to_error())
            return
        except Exception as exc:
            logger.exception("tool %s crashed in task %s", tool.name, task.task_id)
            msg = f"Tool execution failed: {type(exc).__name__}: {exc}"
            if task.kind == Task.Kind.REQUEST:
                await self._finish(task, attempt, TaskStatus.FAILED, msg,
                                   {"content": [{"type": "text", "text": msg}], "isError": True}, None)
            else:
                await self._finish(task, attempt, TaskStatus.FAILED, msg, None,
                                   {"code": INTERNAL_ERROR, "message": msg})
            return
        if backend.cancel_flag:
            return
        if result.get("isError"):
            text = next((c.get("text") for c in result.get("content", []) if c.get("type") == "text"), None)
            await self._finish(task, attempt, TaskStatus.FAILED, f"Tool returned an error: {text or 'isError'}",
                               result, None)
        else:
            await self._finish(task, attempt, TaskStatus.COMPLETED, None, result, None)

    async def _finish(
        self, task: Task, attempt: int, status: str, message: str | None,
        result: dict[str, Any] | None, error: dict[str, Any] | None,
    ) -> None:
        ok = await _db(services.transition)(
            task=task, to=status, status_message=message, result=result, error=error, attempt=attempt
        )
        if not ok:
            logger.info("late outcome of task %s discarded (status is no longer live)", task.task_id)

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

