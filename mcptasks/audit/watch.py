"""Refusals into the audit trail, and the suspicious patterns they form.

Every refusal the endpoint sends (authentication failure, missing scope, 429, quota, a task id
that is not the caller's) is audited, but an attacker must not be able to turn refusals into
unbounded audit writes: in each window of ``AUDIT_REFUSAL_EVERY_S`` a kind is written at most
once per subject (principal; client IP, IPv6 by /64, before authentication; the owner tenant for
``task.cross_tenant``) and at most ``AUDIT_REFUSAL_BUDGET`` times in all, counted across processes
in Redis. What was not written is counted per tenant and kind (``mcptasks_audit_suppressed_total``)
and written as one ``audit.suppressed`` event per tenant and kind when the window has ended
(:func:`mcptasks.audit.throttle.flush_suppressed`, run with the sealer), so the dashboard still
counts every refusal.

Patterns are counted across processes (Redis counters through :mod:`tenants.kv`, one per
subject and window): many missing-task lookups by one principal (enumeration), polls sooner
than ``pollInterval``, many authentication failures from one IP. Reaching a threshold writes
one flagged event (``flag.*``) per window; with a penalty configured the principal is then held to
a lower rate (:func:`tenants.ratelimit.penalties.penalize`, setting ``MCPTASKS_FLAG_PENALTY_S``).

Subjects are integers or parsed IP addresses, never client strings.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
import time
from collections import OrderedDict
from typing import Any

from asgiref.sync import sync_to_async

from mcptasks import conf
from mcptasks.audit import trail
from mcptasks.audit.throttle import _MAX_SUBJECTS, throttle
from mcptasks.models import Task
from mcptasks.observability.metrics import REFUSALS
from tenants import clientaddr, kv
from tenants import conf as tenant_conf
from tenants.auth import AuthContext
from tenants.models import Tenant
from tenants.ratelimit import penalties

logger = logging.getLogger(__name__)

_TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

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
    trail.append(tenant_id=tenant_id, principal_id=principal_id, action=action, task_id=task_id, data=data)


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
        penalties.penalize(principal_id=principal_id, seconds=penalty_s,
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
    now = time.monotonic()
    with _slugs_lock:
        age = now - _slugs[0]
        if _slugs[0] and age < _SLUGS_TTL_S and (slug is None or slug in _slugs[1] or age < 1.0):
            return _slugs[1]
    found = dict(Tenant.objects.values_list("slug", "pk"))
    with _slugs_lock:
        _slugs = (now, found)
    return found


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
