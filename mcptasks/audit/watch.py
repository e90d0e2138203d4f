"""Refusals into the audit trail, and the suspicious patterns they form.

Every refusal the endpoint sends (authentication failure, missing scope, 429, quota, a task id
that is not the caller's) is audited, but an attacker must not be able to turn refusals into
unbounded audit writes: in each window of ``AUDIT_REFUSAL_EVERY_S`` a kind is written at most
once per subject (principal; client IP, IPv6 by /64, before authentication; the owner tenant for
``task.cross_tenant``) and at most ``AUDIT_REFUSAL_BUDGET`` times in all, counted across processes
in Redis. What was not written is counted per tenant and kind (``mcptasks_audit_suppressed_total``)
and written as one ``audit.suppressed`` event per tenant and kind when the window has ended
(:func:`flush_suppressed`, run with the sealer), so the dashboard still counts every refusal.

Patterns are counted across processes (Redis counters through :mod:`tenants.kv`, one per
subject and window): many missing-task lookups by one principal (enumeration), polls sooner
than ``pollInterval``, many authentication failures from one IP. Reaching a threshold writes
one flagged event (``flag.*``) per window; with a penalty configured the principal is then held to
a lower rate (:func:`tenants.ratelimit.penalize`, setting ``MCPTASKS_FLAG_PENALTY_S``).

Subjects are integers or parsed IP addresses, never client strings.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import re
import threading
import time
from collections import OrderedDict
from typing import Any

from asgiref.sync import sync_to_async

from tenants import clientaddr, kv, ratelimit
from tenants import conf as tenant_conf
from tenants.auth import AuthContext

from . import conf
from .metrics import REFUSALS, SUPPRESSED

logger = logging.getLogger(__name__)

_MAX_SUBJECTS = 10_000
#: The action of the events that count refusals the throttle did not write.
SUPPRESSED_ACTION = "audit.suppressed"
_TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

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


def client_ip(scope: dict[str, Any]) -> str:
    """The client address of an ASGI scope, parsed (``"unknown"`` when absent or malformed).

    Through :func:`tenants.clientaddr.from_scope`: behind a trusted proxy it is the forwarded
    client, not the proxy (else every client would share one subject).
    """
    return clientaddr.from_scope(scope)


def ip_subject(ip: str) -> str:
    """The throttling subject of a client address: IPv4 as is, IPv6 by its /64 (one host owns a
    whole /64, so counting single IPv6 addresses would give an attacker 2^64 subjects)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return "unknown"
    if addr.version == 6:
        return str(ipaddress.ip_network(f"{addr}/64", strict=False))
    return str(addr)


class _Flagged:
    """(pattern, subject, window) already flagged by this process: stop counting them. Bounded.

    A principal that keeps misbehaving after its flag costs no more Redis round trips until the
    next window (the flag is written once per window anyway).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, str, int], None] = OrderedDict()

    def __contains__(self, key: tuple[str, str, int]) -> bool:
        with self._lock:
            return key in self._seen

    def add(self, key: tuple[str, str, int]) -> None:
        with self._lock:
            self._seen[key] = None
            while len(self._seen) > _MAX_SUBJECTS:
                self._seen.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (tests)."""
        with self._lock:
            self._seen.clear()


flagged = _Flagged()


def _counter(kind: str, subject: str) -> tuple[tuple[str, str, int], str, int]:
    """(flag key, Redis key, ttl) of the (kind, subject) counter of this window."""
    window_s = conf.get().WATCH_WINDOW_S
    window = int(time.time() // window_s)
    return (kind, subject, window), kv.key(f"watch:{kind}:{subject}:{window}"), window_s + 5


def _queue_incr(pipe: Any, key: str, ttl: int) -> None:
    pipe.incr(key)
    pipe.expire(key, ttl)


def _count(kind: str, subject: str) -> int:
    """Add one to the (kind, subject) counter of this window (shared across processes); 0 when
    this process already flagged it in this window (nothing counted)."""
    flag_key, key, ttl = _counter(kind, subject)
    if flag_key in flagged:
        return 0

    def remote(r: Any) -> int:
        pipe = r.pipeline(transaction=False)
        _queue_incr(pipe, key, ttl)
        return int(pipe.execute()[0])

    return kv.call(remote, fallback=lambda store: store.incr(key, ttl_s=ttl))


async def _acount(kind: str, subject: str) -> int:
    """:func:`_count` from async code (the async Redis client: no thread hop)."""
    flag_key, key, ttl = _counter(kind, subject)
    if flag_key in flagged:
        return 0

    async def remote(r: Any) -> int:
        pipe = r.pipeline(transaction=False)
        _queue_incr(pipe, key, ttl)
        return int((await pipe.execute())[0])

    return await kv.acall(remote, fallback=lambda store: store.incr(key, ttl_s=ttl))


def _write(*, tenant_id: int | None, principal_id: int | None, action: str, task_id: str = "",
           data: dict[str, Any]) -> None:
    from .services import record_audit_ids

    record_audit_ids(tenant_id=tenant_id, principal_id=principal_id, action=action, task_id=task_id, data=data)


def _flag(*, pattern: str, kind: str, subject: str, threshold: int, count: int, tenant_id: int | None,
          principal_id: int | None, data: dict[str, Any]) -> None:
    """At the threshold exactly (once per window): a flagged event, and the penalty if configured.

    From the threshold on, this process stops counting the subject until the next window.
    """
    if count >= threshold:
        flagged.add(_counter(kind, subject)[0])
    if count != threshold:
        return
    limits = tenant_conf.get()
    penalty_s = limits.FLAG_PENALTY_S if principal_id is not None else 0
    _write(tenant_id=tenant_id, principal_id=principal_id, action=f"flag.{pattern}",
           data={**data, "count": count, "window_s": conf.get().WATCH_WINDOW_S, "penalty_s": penalty_s})
    if penalty_s > 0 and principal_id is not None:
        ratelimit.penalize(principal_id=principal_id, seconds=penalty_s,
                           rate_per_min=limits.FLAG_PENALTY_RATE_PER_MIN)


# --- what the transport reports (sync; the async wrappers below hop once, only on refusals) ---


def refused(*, auth: AuthContext, action: str, data: dict[str, Any]) -> None:
    """An authenticated request was refused (``auth.scope_refused``, ``ratelimit.refused``, ...)."""
    REFUSALS.labels(action).inc()
    if throttle.admit(action, f"p{auth.principal_id}", tenant_id=auth.tenant_id):
        _write(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action=action, data=data)


def auth_failed(*, ip: str, status: int, reason: str, path: str, tenant_slug: str | None) -> None:
    """A request that presented a credential failed authentication (bad, expired or revoked
    token, wrong tenant...). Audited in the chain of the tenant endpoint it was sent to, if any."""
    from tenants.models import Tenant

    REFUSALS.labels("auth.failed").inc()
    settings = conf.get()
    subject = ip_subject(ip)
    # Suppressed failures are counted in the chain of a known tenant (an id from a periodically
    # reloaded map, no query per request: the slug is the caller's choice), else in chain 0.
    known = _tenant_ids(tenant_slug).get(tenant_slug) if tenant_slug else None
    admitted = throttle.admit("auth.failed", subject, tenant_id=known)
    count = _count("auth", subject)
    if not admitted and count != settings.WATCH_AUTH_FAILURES:
        return  # nothing to write: no database query for a flood of bad tokens
    tenant_id = Tenant.objects.filter(slug=tenant_slug).values_list("pk", flat=True).first() if tenant_slug else None
    if admitted:
        data = {"ip": ip, "status": status, "reason": reason[:200], "path": path[:100]}
        _write(tenant_id=tenant_id, principal_id=None, action="auth.failed", data=data)
    _flag(pattern="auth_failures", kind="auth", subject=subject, threshold=settings.WATCH_AUTH_FAILURES,
          count=count, tenant_id=tenant_id, principal_id=None, data={"ip": subject})


def lookup_failed(*, auth: AuthContext, method: str, task_id: str, error: str) -> None:
    """A ``tasks/*`` lookup found no task of the caller: audited, checked for another tenant's
    task (``task.cross_tenant``, in the owner's chain) and counted for enumeration."""
    from .models import Task

    REFUSALS.labels("task.lookup_failed").inc()
    settings = conf.get()
    subject = f"p{auth.principal_id}"
    data = {"method": method, "taskId": task_id[:100], "error": error}
    if throttle.admit("task.lookup_failed", subject, tenant_id=auth.tenant_id):
        _write(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action="task.lookup_failed", data=data)
    if _TASK_ID.fullmatch(task_id):
        owner = Task.objects.filter(task_id=task_id).exclude(tenant_id=auth.tenant_id).values_list(
            "tenant_id", flat=True).first()
        if owner is not None:
            # Never told to the caller (it got the same error as for a missing task).
            cross = {"method": method, "taskId": task_id, "from_tenant": auth.tenant_slug,
                     "from_principal": auth.principal_id}
            # Only in the owner's chain: the caller's own auditors must not learn that the id exists.
            # Throttled per owner (and the kind's budget): probes must not flood the victim's chain.
            REFUSALS.labels("task.cross_tenant").inc()
            if throttle.admit("task.cross_tenant", f"t{owner}", tenant_id=owner):
                _write(tenant_id=owner, principal_id=None, action="task.cross_tenant", task_id=task_id, data=cross)
    _flag(pattern="enumeration", kind="lookup", subject=subject, threshold=settings.WATCH_LOOKUP_FAILURES,
          count=_count("lookup", subject), tenant_id=auth.tenant_id, principal_id=auth.principal_id,
          data={"method": method})


def fast_poll(*, auth: AuthContext, count: int | None = None) -> None:
    """A ``tasks/get`` came sooner than the task's ``pollInterval`` (``count``: already counted)."""
    subject = f"p{auth.principal_id}"
    _flag(pattern="fast_polling", kind="poll", subject=subject, threshold=conf.get().WATCH_FAST_POLLS,
          count=_count("poll", subject) if count is None else count, tenant_id=auth.tenant_id,
          principal_id=auth.principal_id, data={})


_slugs_lock = threading.Lock()
_slugs: tuple[float, dict[str, int]] = (0.0, {})
#: How long the slug -> tenant id map of :func:`_tenant_ids` is reused.
_SLUGS_TTL_S = 30.0


def _tenant_ids(slug: str | None = None) -> dict[str, int]:
    """Every tenant's id by slug, reloaded at most every ``_SLUGS_TTL_S`` by this process, or
    every second while ``slug`` is missing from it (a new tenant; unknown slugs cost at most one
    query a second)."""
    global _slugs
    from tenants.models import Tenant

    now = time.monotonic()
    with _slugs_lock:
        age = now - _slugs[0]
        if _slugs[0] and age < _SLUGS_TTL_S and (slug is None or slug in _slugs[1] or age < 1.0):
            return _slugs[1]
    found = dict(Tenant.objects.values_list("slug", "pk"))
    with _slugs_lock:
        _slugs = (now, found)
    return found


def flush_suppressed() -> int:
    """Write the suppressed-refusal counts of ended windows: one ``audit.suppressed`` event per
    tenant chain, kind and window (``data``: kind, count, window start and length). Returns how
    many events were written. Run with the sealer by every process; each count is taken once."""
    from tenants.models import Tenant

    from . import audit

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


def _safely(fn: Any) -> Any:
    """Recording a refusal never turns the refusal itself into an error."""

    def run(**kwargs: Any) -> None:
        try:
            fn(**kwargs)
        except Exception:
            logger.warning("could not record %s", fn.__name__, exc_info=True)

    # The request path's executor, like every other ORM call of the consumer.
    return sync_to_async(run)


_write_refusal = _safely(_write)


async def arefused(*, auth: AuthContext, action: str, data: dict[str, Any]) -> None:
    """:func:`refused` from async code: a flood of refusals costs no thread hop (throttled first)."""
    REFUSALS.labels(action).inc()
    if await throttle.aadmit(action, f"p{auth.principal_id}", tenant_id=auth.tenant_id):
        await _write_refusal(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action=action, data=data)


aauth_failed = _safely(auth_failed)
alookup_failed = _safely(lookup_failed)
_afast_poll_flag = _safely(fast_poll)


async def afast_poll(*, auth: AuthContext) -> None:
    """:func:`fast_poll` from async code: counted without a thread hop (and not at all once this
    process flagged the principal in this window); only the flag itself hops to the database."""
    try:
        count = await _acount("poll", f"p{auth.principal_id}")
    except Exception:
        logger.warning("could not count a fast poll", exc_info=True)
        return
    if count >= conf.get().WATCH_FAST_POLLS:
        await _afast_poll_flag(auth=auth, count=count)
