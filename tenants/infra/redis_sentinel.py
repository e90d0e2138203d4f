"""Redis Sentinel for the pools of :mod:`tenants.infra.redis_pools`: discovery that trusts the
newest configuration epoch, and bounded blocking pools that follow the primary when it moves."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis
from redis import asyncio as aioredis
from redis import sentinel as ssentinel
from redis.asyncio import sentinel as asentinel

logger = logging.getLogger(__name__)


def _newest_primary(states: list[dict[str, Any]]) -> tuple[str, int] | None:
    """The primary named by the newest configuration among the Sentinels' answers.

    Sentinels learn of a failover one after another (the leader first, the others from its hello
    messages a second or two later). A Sentinel that has not heard yet still names the old
    primary, and a killed primary that was just restarted answers as a primary until the
    Sentinels turn it into a replica: taking the first Sentinel's word (redis-py's rule) sent a
    process's writes and blocking reads to that node, where they were lost. Each answer carries
    the configuration epoch it comes from; the highest epoch is the Sentinels' current truth
    (ties: the address most of them name).
    """
    best: dict[tuple[str, int], tuple[int, int]] = {}
    for state in states:
        address = (str(state["ip"]), int(state["port"]))
        epoch = int(state.get("config-epoch", 0) or 0)
        seen_epoch, votes = best.get(address, (-1, 0))
        best[address] = (max(seen_epoch, epoch), votes + 1)
    if not best:
        return None
    return max(best.items(), key=lambda item: item[1])[0]


class EpochSentinel(ssentinel.Sentinel):
    """redis-py's Sentinel manager, asking every Sentinel and trusting the newest epoch."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        """The primary's address by :func:`_newest_primary` (MasterNotFoundError when none)."""
        states: list[dict[str, Any]] = []
        for sentinel in self.sentinels:
            try:
                masters: Any = sentinel.sentinel_masters()
                state = masters.get(service_name)
            except (redis.ConnectionError, redis.TimeoutError):
                continue
            if state and self.check_master_state(state, service_name):
                states.append(state)
        found = _newest_primary(states)
        if found is None:
            raise ssentinel.MasterNotFoundError(f"No master found for {service_name!r}")
        return found


class AsyncEpochSentinel(asentinel.Sentinel):
    """:class:`EpochSentinel` for ``redis.asyncio`` (the Sentinels are asked at once)."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        """The primary's address by :func:`_newest_primary` (MasterNotFoundError when none)."""

        async def ask(sentinel: Any) -> dict[str, Any] | None:
            try:
                state: dict[str, Any] | None = (await sentinel.sentinel_masters()).get(service_name)
            except (redis.ConnectionError, redis.TimeoutError):
                return None
            return state if state and self.check_master_state(state, service_name) else None

        answers = await asyncio.gather(*(ask(s) for s in self.sentinels))
        found = _newest_primary([a for a in answers if a is not None])
        if found is None:
            raise asentinel.MasterNotFoundError(f"No master found for {service_name!r}")
        return found


class BlockingSentinelPool(ssentinel.SentinelConnectionPool, redis.BlockingConnectionPool):
    """Sentinel-managed connections (primary re-resolved on connect, dropped on READONLY), bounded and
    blocking like the single-server pools (redis-py's own Sentinel pool refuses the call past its size)."""


class AsyncBlockingSentinelPool(asentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """:class:`BlockingSentinelPool` for ``redis.asyncio``, which also drops connections held *in use*
    on the old primary once the Sentinels name a new one.

    redis-py re-resolves the primary only when a connection (re)connects. A connection blocked in a
    read (the channel layer's BZPOPMIN) stays on the demoted primary until that server closes it:
    the process's receives, hence every live stream and ``/readyz``, stalled for 10 s and more
    after a failover. Every :attr:`watch_s` while any connection is in use, a background check
    asks the Sentinels (:meth:`get_master_address`); when the primary moved, every connection of
    the pool is disconnected, so blocked reads fail at once and reconnect to the new primary.
    """

    #: Longest time between two checks of the primary's address while the pool is in use.
    watch_s = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._checked_at = 0.0
        self._watch: asyncio.Future[None] | None = None

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        """A connection, with the primary watched while any connection of the pool is in use."""
        if self._watch is None or self._watch.done():
            # The reference keeps the task alive; _watch_primary never raises (nothing to retrieve).
            self._watch = asyncio.ensure_future(self._watch_primary())
        return await super().get_connection(*args, **kwargs)

    async def _watch_primary(self) -> None:
        """Check the primary every :attr:`watch_s` for as long as connections are in use.

        Checked on a timer, not only when a connection is taken: a process whose one use of the
        pool is a blocking read (an idle worker waiting for a wake-up) takes no other connection,
        and its read stayed on the demoted primary until the read's own timeout, while every
        wake-up went to the new one (found by the Sentinel failover test: a worker deaf for 9 s).
        """
        while True:
            now = time.monotonic()
            if now - self._checked_at >= self.watch_s:
                self._checked_at = now
                await self._check_primary()
            await asyncio.sleep(self.watch_s)
            if not getattr(self, "_in_use_connections", None):
                return

    async def _check_primary(self) -> None:
        if self.master_address is None:
            return  # nothing connected yet: the next connect asks the Sentinels anyway
        try:
            await self.get_master_address()
        except Exception:
            return  # Sentinels unreachable or no primary: connections fail (and recover) on their own

    async def get_master_address(self) -> Any:
        """The primary's address; when it moved, every connection of the pool is dropped.

        redis-py drops only the idle ones here. A connection in use (a blocking read) then stayed on
        the demoted primary, and since the address was already updated, the watch found nothing
        to do: whichever noticed the move first, a new connection or the watch, decided whether a
        worker heard its wake-ups within a second or after its read's own timeout.
        """
        address = await self.sentinel_manager.discover_master(self.service_name)
        known = self.master_address
        if self.is_master and known != address:
            self.master_address = address
            if known is not None:
                logger.warning("Redis primary of %r moved from %s:%s to %s:%s; reconnecting", self.service_name,
                               known[0], known[1], address[0], address[1])
                try:
                    await self.disconnect(inuse_connections=True)
                except Exception:
                    logger.debug("disconnecting from the old primary failed", exc_info=True)
        return address
