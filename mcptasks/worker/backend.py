"""How a tool runs in a worker: its :class:`ToolContext` backend (progress, logs, status
messages, requests to the client) and :func:`run_tool`, which turns the run into an outcome."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import Executor
from typing import Any, Protocol

from django.utils import timezone

from mcptasks import conf
from mcptasks.models import McpSession, Outcome, Task, TaskMessage, TaskStatus
from mcptasks.protocol.errors import CAPABILITY_MISSING, INTERNAL_ERROR, McpError
from mcptasks.protocol.messages import related_task_meta
from mcptasks.streams import events
from mcptasks.tasks import fanout, messages, runs, selectors, sessions, transitions
from mcptasks.tools.context import ToolCancelled, ToolContext
from mcptasks.tools.registry import Registry, ToolInputError
from mcptasks.worker.dbthread import db
from mcptasks.worker.outcomes import make_outcome

logger = logging.getLogger(__name__)


#: Seconds between two saves of a run's progress on its task row (the operator's task page).
PROGRESS_SAVE_EVERY_S = 1.0


class RunHost(Protocol):
    """What a run needs of the worker that hosts it (:class:`mcptasks.worker.loop.Worker`)."""

    @property
    def registry(self) -> Registry: ...

    @property
    def tool_executor(self) -> Executor: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def wake(self) -> asyncio.Event: ...


class WorkerBackend:
    """The :class:`ToolContext` backend for a tool running in this worker."""

    def __init__(self, worker: RunHost, task: Task) -> None:
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
        return await db(selectors.session_of)(task=self.task)

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
        return runs.is_current_run(task_id=self.task.task_id, attempt=self.attempt)

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
        await db(runs.save_progress)(task_id=self.task.task_id, attempt=self.attempt, report=report)

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
            fanout.publish_for_task(task=self.task, message=note)
            return True

        return bool(await db(send)())

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
        if session is None or not sessions.log_level_allows(session.log_level, level):
            return
        params: dict[str, Any] = {"level": level, "data": data}
        if logger_name:
            params["logger"] = logger_name
        if self.task.kind == Task.Kind.TASK:
            params["_meta"] = related_task_meta(self.task.task_id)
        await db(fanout.publish_for_task)(
            task=self.task, message={"jsonrpc": "2.0", "method": "notifications/message", "params": params}
        )

    async def set_status_message(self, message: str) -> None:
        await db(transitions.set_status_message)(task=self.task, message=message, attempt=self.attempt)

    async def close_stream(self) -> None:
        """Close the client's connection to a plain request's POST stream (it resumes by GET)."""
        if self.task.kind == Task.Kind.REQUEST and self.task.stream_id:
            await db(events.publish)(session_id=self.task.session_id, stream_id=self.task.stream_id,
                                   message={"_close": True})

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        capability = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling",
                      "roots/list": "roots"}.get(method)
        if capability and not self.client_supports(capability):
            raise McpError(CAPABILITY_MISSING, f"The client did not declare the {capability} capability",
                           {"requiredCapabilities": {capability: {}}})
        self.answered.clear()
        msg = await db(messages.add_task_message)(task=self.task, method=method, params=params)
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
            row = await db(selectors.message_answer)(message_pk=msg.pk)
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


async def run_tool(worker: RunHost, task: Task, backend: WorkerBackend) -> Outcome | None:
    """Run the tool; how the run ended (None: nothing to write: cancelled, superseded, handed back)."""
    tool = worker.registry.get_tool(task.tool_name)
    if tool is None:
        msg = f"Unknown tool: {task.tool_name}"
        return make_outcome(task, TaskStatus.FAILED, msg, error={"code": INTERNAL_ERROR, "message": msg})
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
            result = await tool.invoke(arguments, ctx, executor=worker.tool_executor)
    except ToolInputError as exc:
        return make_outcome(task, TaskStatus.FAILED, str(exc),
                        result={"content": [{"type": "text", "text": str(exc)}], "isError": True})
    except TimeoutError:
        if backend.cancel_flag:
            return None
        if timeout_cm is not None and timeout_cm.expired():
            backend.cancel_flag = True  # a sync tool still in its thread sees ctx.cancelled
            msg = f"Tool {tool.name} timed out after {limit_s:g}s"
        else:
            msg = "Tool execution failed: TimeoutError"
        return make_outcome(task, TaskStatus.FAILED, msg, error={"code": INTERNAL_ERROR, "message": msg})
    except asyncio.CancelledError:
        if backend.cancel_flag or worker.stopping:
            return None  # cancelled, superseded or handed back: any late outcome is discarded
        raise
    except ToolCancelled as exc:
        if backend.cancel_flag or worker.stopping or not await db(backend._still_ours)():
            return None
        # The tool gave up on its own (e.g. its pending request vanished): a failure.
        msg = f"Tool execution failed: {exc}"
        return make_outcome(task, TaskStatus.FAILED, msg, error={"code": INTERNAL_ERROR, "message": msg})
    except McpError as exc:
        if backend.cancel_flag:
            return None
        return make_outcome(task, TaskStatus.FAILED, f"Tool execution failed: {exc.message}", error=exc.to_error())
    except Exception as exc:
        if backend.cancel_flag:
            return None
        logger.exception("tool %s crashed in task %s", tool.name, task.task_id)
        msg = f"Tool execution failed: {type(exc).__name__}: {exc}"
        if task.kind == Task.Kind.REQUEST:
            return make_outcome(task, TaskStatus.FAILED, msg,
                            result={"content": [{"type": "text", "text": msg}], "isError": True})
        return make_outcome(task, TaskStatus.FAILED, msg, error={"code": INTERNAL_ERROR, "message": msg})
    if backend.cancel_flag:
        return None
    if result.get("isError"):
        text = next((c.get("text") for c in result.get("content", []) if c.get("type") == "text"), None)
        return make_outcome(task, TaskStatus.FAILED, f"Tool returned an error: {text or 'isError'}", result=result)
    return make_outcome(task, TaskStatus.COMPLETED, None, result=result)
