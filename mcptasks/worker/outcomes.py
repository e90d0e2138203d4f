"""Writing runs' outcomes: checked for storability, queued, and written in batches (one
transaction per batch, retried through a database outage while the lease lasts)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from typing import Any

from django.db import InterfaceError, OperationalError

from mcptasks import conf
from mcptasks.models import Outcome, Task, TaskStatus
from mcptasks.protocol.errors import INTERNAL_ERROR
from mcptasks.protocol.jsonrpc import unstorable_string
from mcptasks.streams import webhooks
from mcptasks.tasks import transitions
from mcptasks.worker.dbthread import db

logger = logging.getLogger(__name__)


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


#: Most outcomes written in one transaction.
FINISH_BATCH = 100


def _delivered(written: list[bool]) -> bool:
    """Whether a written batch may have webhook rows (unknown counts as yes)."""
    return not isinstance(written, transitions.Finished) or written.deliveries > 0


def make_outcome(task: Task, status: str, message: str | None, *, result: dict[str, Any] | None = None,
                 error: dict[str, Any] | None = None) -> Outcome:
    """The outcome of ``task``'s current run (its attempt) with this status, message and payload."""
    return Outcome(pk=task.pk, attempt=task.attempt, status=status, message=message, result=result, error=error)


class OutcomeWriting:
    """The :class:`~mcptasks.worker.loop.Worker`'s outcome writer: one batch writer serves every run."""

    #: Outcomes waiting for the batch writer, and the writer while it runs.
    _outcomes: list[tuple[Task, Outcome, asyncio.Future[bool]]]
    _writer: asyncio.Future[None] | None
    #: The webhook delivery loop while the worker runs (woken when a batch wrote deliveries).
    _webhooks: webhooks.WebhookSender | None

    async def _finish(self, task: Task, outcome: Outcome) -> None:
        """Write a run's outcome: queued to the batch writer, returns once it is committed."""
        problem = storable_problem(outcome.result)
        if problem is not None:
            # Checked before the write: an unstorable result fails the task at once with a clear
            # message, instead of raising inside the final write and waiting for the lease.
            logger.warning("task %s: tool %s returned a result that cannot be stored: %s",
                           task.task_id, task.tool_name, problem)
            message = f"Tool returned a result that cannot be stored: {problem}"
            outcome = make_outcome(task, TaskStatus.FAILED, message, error={"code": INTERNAL_ERROR, "message": message})
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
                # As returned: a transitions.Finished also says whether webhook rows were written.
                return await db(transitions.finish_runs)(runs=runs)
            except (OperationalError, InterfaceError) as exc:
                if asyncio.get_running_loop().time() + delay > deadline:
                    logger.error("giving up writing %d outcomes (%s); their leases will lapse",
                                 len(runs), type(exc).__name__)
                    return [False] * len(runs)
                logger.warning("database unavailable writing %d outcomes (%s); retrying in %.1f s",
                               len(runs), type(exc).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
