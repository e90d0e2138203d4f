"""One Redis round trip for the counts of :func:`tenants.ratelimit.acount_request`: a Lua script
that counts, notes a poll and charges a too-early poll, for every request counted at the same
time on one event loop (:mod:`tenants.infra.coalesce`)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tenants import kv
from tenants.infra.coalesce import Coalescer

#: Any number of counts at once, in order. Per count, KEYS: previous window, this window, poll
#: note; ARGV: counter ttl, count?, poll?, now, poll note ttl, poll interval (ms). Returns, per
#: count, {previous count, this count (before any charge), charged?}: the same as running them
#: one after the other.
_COUNT_LUA = """
local out = {}
for i = 0, #KEYS / 3 - 1 do
  local k, a = i * 3, i * 6
  local previous, current, charged = 0, 0, 0
  if ARGV[a + 2] == '1' then
    previous = tonumber(redis.call('GET', KEYS[k + 1]) or '0')
    current = redis.call('INCR', KEYS[k + 2])
    redis.call('EXPIRE', KEYS[k + 2], ARGV[a + 1])
  end
  if ARGV[a + 3] == '1' then
    local last = redis.call('SET', KEYS[k + 3], ARGV[a + 4], 'EX', ARGV[a + 5], 'GET')
    if last and (tonumber(ARGV[a + 4]) - tonumber(last)) * 1000 < tonumber(ARGV[a + 6]) then
      redis.call('INCR', KEYS[k + 2])
      charged = 1
    end
  end
  out[#out + 1] = previous
  out[#out + 1] = current
  out[#out + 1] = charged
end
return out
"""


@dataclass(frozen=True)
class CountItem:
    """One request's count for :data:`counts`: the script's keys and arguments, and the same
    count on the in-process store (used when Redis is unavailable)."""

    keys: tuple[str, str, str]
    args: tuple[Any, ...]
    local: Callable[[kv.LocalStore], tuple[int, int, bool]]


async def _count_batch(batch: Sequence[CountItem]) -> list[tuple[int, int, bool]]:
    """The counts of ``batch`` in one script call (each on the local store without Redis)."""

    async def remote(r: Any) -> list[tuple[int, int, bool]]:
        out = await _count_script(r)(
            keys=[k for item in batch for k in item.keys], args=[a for item in batch for a in item.args]
        )
        return [(int(out[i] or 0), int(out[i + 1]), bool(out[i + 2])) for i in range(0, len(out), 3)]

    return await kv.acall(remote, fallback=lambda store: [item.local(store) for item in batch])


#: Counts made at the same time on one event loop share one round trip (see tenants.infra.coalesce).
counts: Coalescer[CountItem, tuple[int, int, bool]] = Coalescer(_count_batch, max_batch=32)

_scripts: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _count_script(client: Any) -> Any:
    """The counting script registered on ``client`` (EVALSHA, loaded again after a Redis restart)."""
    script = _scripts.get(client)
    if script is None:
        script = _scripts[client] = client.register_script(_COUNT_LUA)
    return script
