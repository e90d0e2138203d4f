"""A worker's channel-layer membership: the wake-up group and its own group (the signals of its
runs), rejoined after a layer failure, and the receive loop that turns their messages into wake-ups,
answers and cancellations."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from mcptasks import conf
from mcptasks.streams import layers, signals
from mcptasks.streams import membership as group_membership

logger = logging.getLogger(__name__)

#: Re-add the worker to its channel-layer groups this often (the layer expires memberships).
GROUP_REFRESH_S = 3600.0


class ChannelMembership:
    """The :class:`~mcptasks.worker.loop.Worker`'s channel-layer side."""

    worker_id: str
    channel: str | None
    stopping: bool
    wake: asyncio.Event
    announce: Callable[[], None]
    running: dict[str, Any]
    _layer: Any
    _loop: asyncio.AbstractEventLoop | None
    _rejoining: asyncio.Future[Any] | None
    _joined_at: float

    _check_cancel: Callable[[str], Awaitable[None]]

    async def _join_groups(self) -> bool:
        """(Re)join the wake-up group and the groups of our running tasks; False if Redis fails.

        Needed after any layer failure: a Redis that restarted empty has forgotten every
        membership, and without the wake-up group claims would wait for the poll backstop.
        """
        layer = self._layer
        if layer is None or self.channel is None:
            return True
        # The signals of our runs come through our own group (signals.worker_group): no group per run.
        groups = [signals.WORKERS_GROUP, signals.worker_group(self.worker_id)]
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
                self.announce()
            elif kind == "task.signal":
                entry = self.running.get(msg.get("task_id", ""))
                if entry is None:
                    continue
                _atask, backend, _attempt = entry
                event = msg.get("event")
                if event == "answer":
                    backend.answered.set()
                elif backend.finishing:
                    # The tool has returned: a cancel racing the outcome has nothing left to stop
                    # (checking would log a completed task as "cancelled or superseded").
                    continue
                elif event == "cancel":
                    try:
                        await self._check_cancel(msg["task_id"])
                    except Exception:
                        logger.warning("cancel check failed", exc_info=True)
