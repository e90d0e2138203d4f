"""Which refusals are written to the audit trail, counted across processes, and the counts of
those that were not.

In each window of ``AUDIT_REFUSAL_EVERY_S`` a refusal kind is written at most once per subject
and at most ``AUDIT_REFUSAL_BUDGET`` times in all (:class:`_Throttle`); what was not written is
counted per tenant and kind and written as one ``audit.suppressed`` event per tenant and kind
once the window has ended (:func:`flush_suppressed`, run with the sealer by every process).
The patterns those refusals form are watched in :mod:`mcptasks.audit.watch`.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import OrderedDict
from typing import Any

from mcptasks import conf
from mcptasks.audit import trail as audit
from mcptasks.observability.metrics import SUPPRESSED
from tenants import kv
from tenants.models import Tenant

#: Most subjects (or suppressed counts) one process holds in memory.
_MAX_SUBJECTS = 10_000
#: The action of the events that count refusals the throttle did not write.
SUPPRESSED_ACTION = "audit.suppressed"

#: The admission script of :class:`_Throttle`. KEYS: the (kind, subject) counter of the window,
#: the kind's counter of the window, the window's suppressed counts (a hash). ARGV: counters' TTL
#: in ms, the kind's budget, the hash field ("tenant|kind"), the hash's TTL in ms. 1: write it.
_ADMIT = """
local s = redis.call('INCR', KEYS[1])
if s == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  local n = redis.call('INCR', KEYS[2])
  if n == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[1]) end
  if n <= tonumber(ARGV[2]) then return 1 end
end
redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return 0
"""


def _lookback(every_s: float) -> int:
    """How many past windows the flusher and the dashboard look at (about ten minutes, 2..60)."""
    return max(2, min(60, int(600 // every_s)))


class _Throttle:
    """Which refusals are written to the audit log, counted across processes.

    Within each window of ``AUDIT_REFUSAL_EVERY_S`` (fixed windows of wall-clock time, the same
    in every process) a refusal kind is written at most once per subject, and at most
    ``AUDIT_REFUSAL_BUDGET`` times in all, whatever the number of subjects (an attacker with 2^64
    IPv6 addresses or a hundred principals gets no more rows than one). Every refusal not written
    is added to a per-window count by (tenant chain, kind), which :func:`flush_suppressed` writes as
    one ``audit.suppressed`` event per tenant and kind once the window has ended.

    One Redis round trip per refusal (a script: atomic across processes); without Redis, or while
    its breaker is open, the same in this process (bounded).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: The in-process fallback of the suppressed counts: (window, tenant, kind) -> count.
        self._pending: OrderedDict[tuple[int, int, str], int] = OrderedDict()

    @staticmethod
    def _window(every_s: float, now: float | None = None) -> int:
        return int((time.time() if now is None else now) // every_s)

    def _plan(self, kind: str, subject: str, tenant_id: int | None) -> tuple[int, list[str], list[Any]]:
        settings = conf.get()
        every_s = settings.AUDIT_REFUSAL_EVERY_S
        window = self._window(every_s)
        keys = [kv.key(f"athr:{kind}:{window}:s:{subject}"), kv.key(f"athr:{kind}:{window}:n"),
                kv.key(f"athr:sup:{window}")]
        args = [int(every_s * 1000) + 1000, settings.AUDIT_REFUSAL_BUDGET, f"{tenant_id or 0}|{kind}",
                int(_lookback(every_s) * every_s * 1000) + 60_000]
        return window, keys, args

    def _local(self, window: int, keys: list[str], args: list[Any]) -> bool:
        store = kv.local
        if store.incr(keys[0], ttl_s=args[0] / 1000) == 1 and store.incr(keys[1], ttl_s=args[0] / 1000) <= args[1]:
            return True
        tenant, _, kind = str(args[2]).partition("|")
        with self._lock:
            key = (window, int(tenant), kind)
            self._pending[key] = self._pending.get(key, 0) + 1
            self._pending.move_to_end(key)
            while len(self._pending) > _MAX_SUBJECTS:
                self._pending.popitem(last=False)
        return False

    def admit(self, kind: str, subject: str, *, tenant_id: int | None) -> bool:
        """Whether to write this refusal (else it was counted as suppressed)."""
        window, keys, args = self._plan(kind, subject, tenant_id)
        admitted = bool(kv.call(lambda r: r.eval(_ADMIT, len(keys), *keys, *args),
                                fallback=lambda _store: self._local(window, keys, args)))
        if not admitted:
            SUPPRESSED.labels(kind).inc()
        return admitted

    async def aadmit(self, kind: str, subject: str, *, tenant_id: int | None) -> bool:
        """:meth:`admit` from async code (the async Redis client: no thread hop)."""
        window, keys, args = self._plan(kind, subject, tenant_id)

        async def remote(r: Any) -> bool:
            return bool(await r.eval(_ADMIT, len(keys), *keys, *args))

        admitted = await kv.acall(remote, fallback=lambda _store: self._local(window, keys, args))
        if not admitted:
            SUPPRESSED.labels(kind).inc()
        return admitted

    def _windows(self, *, ended_only: bool) -> tuple[float, list[int]]:
        every_s = conf.get().AUDIT_REFUSAL_EVERY_S
        current = self._window(every_s)
        last = current - 1 if ended_only else current
        return every_s, list(range(current - _lookback(every_s), last + 1))

    def _collect(self, *, take: bool, ended_only: bool) -> dict[tuple[int, int, str], int]:
        _every_s, windows = self._windows(ended_only=ended_only)
        found: dict[tuple[int, int, str], int] = {}

        def remote(r: Any) -> list[Any]:
            pipe = r.pipeline(transaction=take)
            for w in windows:
                pipe.hgetall(kv.key(f"athr:sup:{w}"))
                if take:
                    pipe.delete(kv.key(f"athr:sup:{w}"))
            replies = pipe.execute()
            return replies[::2] if take else replies

        for w, reply in zip(windows, kv.call(remote, fallback=lambda _store: [{} for _ in windows]), strict=True):
            for raw_field, raw_count in (reply or {}).items():
                field_ = raw_field.decode() if isinstance(raw_field, bytes) else str(raw_field)
                tenant, _, kind = field_.partition("|")
                found[(w, int(tenant), kind)] = found.get((w, int(tenant), kind), 0) + int(raw_count)
        with self._lock:
            for key in [k for k in self._pending if k[0] in set(windows)]:
                found[key] = found.get(key, 0) + (self._pending.pop(key) if take else self._pending[key])
        return found

    def take_ended(self) -> dict[tuple[int, int, str], int]:
        """Remove and return the suppressed counts of ended windows: (window, tenant, kind) -> n.

        Atomic in Redis (MULTI: read and delete), so each count is taken by one process only.
        """
        return self._collect(take=True, ended_only=True)

    def pending(self) -> dict[tuple[int, int, str], int]:
        """The suppressed counts not yet written (current and ended windows), without taking them."""
        return self._collect(take=False, ended_only=False)

    def forget_local(self) -> None:
        """Forget what only this process holds (tests: what another process would see)."""
        with self._lock:
            self._pending.clear()
        kv.local.clear()

    def clear(self) -> None:
        """Forget everything: the in-process counts and the shared counters under this prefix (tests)."""
        self.forget_local()

        def remote(r: Any) -> None:
            for key in r.scan_iter(match=kv.key("athr:*")):
                r.delete(key)

        kv.call(remote, fallback=lambda _store: None)


throttle = _Throttle()



def flush_suppressed() -> int:
    """Write the suppressed-refusal counts of ended windows: one ``audit.suppressed`` event per
    tenant chain, kind and window (``data``: kind, count, window start and length). Returns how
    many events were written. Run with the sealer by every process; each count is taken once."""
    taken = throttle.take_ended()
    if not taken:
        return 0
    every_s = conf.get().AUDIT_REFUSAL_EVERY_S
    tenants = {t for (_w, t, _k) in taken if t}
    known = set(Tenant.objects.filter(pk__in=tenants).values_list("pk", flat=True))
    events = []
    for (window, tenant, kind), count in sorted(taken.items()):
        start = dt.datetime.fromtimestamp(window * every_s, tz=dt.UTC)
        events.append(audit.event(
            tenant_id=tenant if tenant in known else None, principal_id=None, action=SUPPRESSED_ACTION,
            data={"kind": kind, "count": count, "window_start": start.isoformat(), "window_s": every_s},
        ))
    audit.append_many(events)
    return len(events)
