"""Channel-layer group membership of one listener (an open SSE stream, a worker).

A listener joins groups to be sent what happens to a stream, a session or a task. Joining,
leaving and rejoining after an outage are the same wherever memberships are held: each
operation is bounded by a timeout (a frozen Redis must not freeze the caller), and a failed
receive is reported once per outage (:func:`receive_failed`) so the listener falls back to the
store and rejoins when Redis answers again (see :mod:`mcptasks.streams.layers`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from mcptasks import conf
from mcptasks.streams import layers
from tenants import conf as tenant_conf

logger = logging.getLogger(__name__)


async def join(layer: Any, channel: str, groups: Iterable[str], *, within_s: float) -> Exception | None:
    """Add ``channel`` to each of ``groups`` in turn; the failure that stopped it, or None.

    Cancellation is never swallowed: a consumer or worker being stopped stops here too.
    """
    try:
        for group in groups:
            await asyncio.wait_for(layer.group_add(group, channel), timeout=within_s)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return exc
    return None


async def leave(layer: Any, channel: str, groups: Iterable[str], *, within_s: float) -> None:
    """Remove ``channel`` from ``groups``; stops at the first failure and never raises.

    Memberships expire on their own (the layer's ``group_expiry``): a failed discard costs
    nothing but a few messages nobody reads, so it must never fail the caller's disconnect.
    """
    for group in groups:
        try:
            await asyncio.wait_for(layer.group_discard(group, channel), timeout=within_s)
        except Exception:
            logger.debug("group_discard failed", exc_info=True)
            break


async def receive_failed(exc: BaseException, listener: layers.LayerListener, *, who: str, then: str) -> None:
    """A receive from the layer failed: report it, tell ``listener``, and wait one fallback poll.

    Every listener of the process fails at once: one warning per outage (while the send breaker
    is closed), debug lines for the others. ``who`` and ``then`` word the log line: whose
    receive failed and what it does meanwhile.
    """
    log = logger.debug if layers.send_breaker.is_open else logger.warning
    log("%s receive failed (%s); %s", who, type(exc).__name__, then)
    layers.report_failure(exc, open_s=tenant_conf.get().REDIS_BREAKER_S)
    listener.layer_failed()
    await asyncio.sleep(conf.get().LAYER_FALLBACK_POLL_S)


class Memberships:
    """The groups one open stream is in, kept through layer outages.

    While the layer fails, receiving stops, ``tick`` is called every ``LAYER_FALLBACK_POLL_S``
    (its owner re-reads the store and calls :meth:`rejoin`), and the groups are joined again
    once Redis answers: a Redis that restarted empty has forgotten every membership.
    """

    def __init__(self, layer: Any, *, tick: Callable[[], None], alive: Callable[[], bool]) -> None:
        self.layer = layer
        self.tick = tick
        self.alive = alive
        #: Named on the first join: a request that never joins a group never needs a channel.
        self.channel_name: str | None = None
        self.groups: list[str] = []
        #: Set while the channel layer is failing.
        self.degraded = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: asyncio.Task[None] | None = None

    @functools.cached_property
    def _layer_ok(self) -> asyncio.Event:
        # Cleared while the channel layer is failing.
        ok = asyncio.Event()
        ok.set()
        return ok

    @functools.cached_property
    def _layer_wanted(self) -> asyncio.Event:
        # Set once we joined a group: only then can the layer hold anything for us.
        return asyncio.Event()

    def listen(self) -> None:
        """Be told of layer failures anywhere in this process (see :func:`layers.report_failure`)."""
        self._loop = asyncio.get_running_loop()
        layers.add_listener(self)

    async def join(self, group: str) -> None:
        """Join ``group``; if the layer fails, fall back to ticks (and rejoin later)."""
        if self.layer is None:
            return
        if self.channel_name is None:
            self.channel_name = await self.layer.new_channel()
        self.groups.append(group)
        self._layer_wanted.set()
        if self.degraded:
            return
        failure = await join(self.layer, self.channel_name, [group], within_s=conf.get().LAYER_SEND_TIMEOUT_S)
        if failure is not None:
            layers.report_failure(failure, open_s=tenant_conf.get().REDIS_BREAKER_S)
            self._degrade()

    async def receive(self) -> dict[str, Any]:
        """The next message the layer holds for us (a ``layer.poll`` tick after a failed receive)."""
        await self._layer_wanted.wait()
        await self._layer_ok.wait()
        assert self.channel_name is not None
        try:
            return dict(await self.layer.receive(self.channel_name))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await receive_failed(exc, self, who="channel layer", then="stream falls back to the database")
            return {"type": "layer.poll"}

    def layer_failed(self) -> None:
        """The channel layer failed in this process (any thread): tick, then rejoin."""
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._degrade)

    def _degrade(self) -> None:
        if not self.alive() or self.degraded:
            return
        self.degraded = True
        self._layer_ok.clear()
        self._watch = asyncio.ensure_future(self._tick_while_degraded())

    async def _tick_while_degraded(self) -> None:
        try:
            while self.degraded and self.alive():
                await asyncio.sleep(conf.get().LAYER_FALLBACK_POLL_S)
                self.tick()
        except asyncio.CancelledError:
            pass

    async def rejoin(self) -> bool:
        """While degraded, join every group again; True once that worked (receiving resumes)."""
        if not self.degraded:
            return False
        if self.layer is not None and self.channel_name is not None:
            within_s = max(1.0, conf.get().LAYER_SEND_TIMEOUT_S)
            if await join(self.layer, self.channel_name, self.groups, within_s=within_s) is not None:
                return False
            layers.send_breaker.succeeded()
        self.degraded = False
        self._layer_ok.set()
        return True

    async def leave(self) -> None:
        """Leave every group (not while degraded: the discards would only time out)."""
        if self._watch is not None:
            self._watch.cancel()
        if self.layer is not None and not self.degraded and self.channel_name is not None:
            await leave(self.layer, self.channel_name, self.groups, within_s=conf.get().LAYER_SEND_TIMEOUT_S)
        self.groups = []
        layers.remove_listener(self)

    def end(self) -> None:
        """The owner has ended: no tick outlives it, and the layer drops what waits for its channel."""
        if self._watch is not None:
            self._watch.cancel()
        layers.remove_listener(self)
        layers.forget_channel(self.layer, self.channel_name)
