"""A worker's channel-layer membership: the wake-up group and the groups of its running tasks,
rejoined after a layer failure, and the receive loop that turns their messages into wake-ups,
answers and cancellations."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from mcptasks import conf
from mcptasks.models import LIVE
from mcptasks.streams import layers, signals
from mcptasks.streams import membership as group_membership
from tenants import conf as tenants_conf

logger = logging.getLogger(__name__)

#: Re-add the worker to its channel-layer groups this often (the layer expires memberships).
GROUP_REFRESH_S = 3600.0


class ChannelMembership:
    """The :class:`~mcptasks.worker.loop.Worker`'s channel-layer side."""

    worker_id: str
    channel: str | None
    stopping: bool
    wake: asyncio.Event
    running: dict[str, Any]
    _layer: Any
    _loop: asyncio.AbstractEventLoop | None
    _rejoining: asyncio.Future[Any] | None
    _bg: set[asyncio.Future[Any]]
    _joined_at: float

    _check_cancel: Callable[[str], Awaitable[None]]

    def _task_group(self, task_id: str, *, join: bool) -> None:
        """Join (or leave) a running task's group in the background, so its signals reach us."""
        if self._layer is None or self.channel is None:
            return
        group = signals.task_group(task_id)
        op = self._layer.group_add if join else self._layer.group_discard
        self._background(op(group, self.channel))

    async def _join_groups(self) -> bool:
        """(Re)join the wake-up group and the groups of our running tasks; False if Redis fails.

        Needed after any layer failure: a Redis that restarted empty has forgotten every
        membership, and without the wake-up group claims would wait for the poll backstop.
        """
        layer = self._layer
        if layer is None or self.channel is None:
            return True
        groups = [signals.WORKERS_GROUP, *(signals.task_group(t) for t, (_a, backend, _n) in list(self.running.items())
                                           if backend is None or not backend.finishing)]
        within_s = max(1.0, conf.get().LAYER_SEND_TIMEOUT_S)
        failure = await group_membership.join(layer, self.channel, groups, within_s=within_s)
        if failure is not None:
            logger.debug("worker could not join its groups: %s", type(failure).__name__)
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
                await group_membership.receive_failed(exc, self, who="worker channel",
                                                      then="rejoining when Redis answers")
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
