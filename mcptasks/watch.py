"""Refusals into the audit trail, and the suspicious patterns they form.

Every refusal the endpoint sends (authentication failure, missing scope, 429, quota, a task id
that is not the caller's) is audited, but an attacker must not be able to turn refusals into
unbounded audit writes: each kind is written at most once per ``AUDIT_REFUSAL_EVERY_S`` per
subject (principal, or client IP before authentication) and process, and the next event says
how many were not written (``suppressed``). The per-process map is bounded.

Patterns are counted across processes (Redis counters through :mod:`tenants.kv`, one per
subject and window): many missing-task lookups by one principal (enumeration), polls sooner
than ``pollInterval``, many authentication failures from one IP. Reaching a threshold writes
one flagged event (``flag.*``) per window; with a penalty configured the principal is then held to
a lower rate (:func:`tenants.ratelimit.penalize`, setting ``MCPTASKS_FLAG_PENALTY_S``).

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

from tenants import conf as tenant_conf
from tenants import kv, ratelimit
from tenants.auth import AuthContext

from . import conf
from .metrics import REFUSALS

logger = logging.getLogger(__name__)

_MAX_SUBJECTS = 10_000
_TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class _Throttle:
    """At most one write per (kind, subject) per interval; counts what it skipped. Bounded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()

    def admit(self, kind: str, subject: str, *, every_s: float) -> int | None:
        """None: skip this one. Otherwise how many were skipped since the last admitted one."""
        now = time.monotonic()
        key = (kind, subject)
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < every_s:
                self._seen[key] = (last[0], last[1] + 1)
                return None
            self._seen[key] = (now, 0)
            self._seen.move_to_end(key)
            while len(self._seen) > _MAX_SUBJECTS:
                self._seen.popitem(last=False)
            return last[1] if last is not None else 0

    def clear(self) -> None:
        """Forget everything (tests)."""
        with self._lock:
            self._seen.clear()


throttle = _Throttle()


def client_ip(scope: dict[str, Any]) -> str:
    """The peer address of an ASGI scope, parsed (``"unknown"`` when absent or malformed)."""
    client = scope.get("client") or ("", 0)
    try:
        return str(ipaddress.ip_address(str(client[0])))
    except ValueError:
        return "unknown"


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
    suppressed = throttle.admit(action, f"p{auth.principal_id}", every_s=conf.get().AUDIT_REFUSAL_EVERY_S)
    if suppressed is not None:
        _write(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action=action,
               data={**data, "suppressed": suppressed})


def auth_failed(*, ip: str, status: int, reason: str, path: str, tenant_slug: str | None) -> None:
    """A request that presented a credential failed authentication (bad, expired or revoked
    token, wrong tenant...). Audited in the chain of the tenant endpoint it was sent to, if any."""
    from tenants.models import Tenant

    REFUSALS.labels("auth.failed").inc()
    settings = conf.get()
    suppressed = throttle.admit("auth.failed", ip, every_s=settings.AUDIT_REFUSAL_EVERY_S)
    count = _count("auth", ip)
    if suppressed is None and count != settings.WATCH_AUTH_FAILURES:
        return  # nothing to write: no database query for a flood of bad tokens
    tenant_id = Tenant.objects.filter(slug=tenant_slug).values_list("pk", flat=True).first() if tenant_slug else None
    if suppressed is not None:
        data = {"ip": ip, "status": status, "reason": reason[:200], "path": path[:100], "suppressed": suppressed}
        _write(tenant_id=tenant_id, principal_id=None, action="auth.failed", data=data)
    _flag(pattern="auth_failures", kind="auth", subject=ip, threshold=settings.WATCH_AUTH_FAILURES,
          count=count, tenant_id=tenant_id, principal_id=None, data={"ip": ip})


def lookup_failed(*, auth: AuthContext, method: str, task_id: str, error: str) -> None:
    """A ``tasks/*`` lookup found no task of the caller: audited, checked for another tenant's
    task (``task.cross_tenant``, in the owner's chain) and counted for enumeration."""
    from .models import Task

    REFUSALS.labels("task.lookup_failed").inc()
    settings = conf.get()
    subject = f"p{auth.principal_id}"
    data = {"method": method, "taskId": task_id[:100], "error": error}
    suppressed = throttle.admit("task.lookup_failed", subject, every_s=settings.AUDIT_REFUSAL_EVERY_S)
    if suppressed is not None:
        _write(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action="task.lookup_failed",
               data={**data, "suppressed": suppressed})
    if _TASK_ID.fullmatch(task_id):
        owner = Task.objects.filter(task_id=task_id).exclude(tenant_id=auth.tenant_id).values_list(
            "tenant_id", flat=True).first()
        if owner is not None:
            # Never told to the caller (it got the same error as for a missing task).
            cross = {"method": method, "taskId": task_id, "from_tenant": auth.tenant_slug,
                     "from_principal": auth.principal_id}
            # Only in the owner's chain: the caller's own auditors must not learn that the id exists.
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
    suppressed = throttle.admit(action, f"p{auth.principal_id}", every_s=conf.get().AUDIT_REFUSAL_EVERY_S)
    if suppressed is not None:
        await _write_refusal(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action=action,
                             data={**data, "suppressed": suppressed})


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
