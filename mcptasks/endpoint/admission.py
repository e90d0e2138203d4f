"""The one admission pipeline: what every JSON-RPC request of the endpoint passes before its handler.

Both eras run it, the session-based one (:mod:`mcptasks.endpoint.session_era`) and
the 2026-07-28 one (:mod:`mcptasks.endpoint.eras`), with their own method table
(:class:`~mcptasks.protocol.dispatch.Dispatcher`). The caller was authenticated before the
body was read. In order, :func:`admit`:

1. refuses a method that may not precede ``notifications/initialized`` on a session that has
   not sent it yet (400, -32600; the route's ``before_init``);
2. takes the request's OAuth scope and rate class from its route (``Route.admission_rules``: the
   declared ones, or the route's own rule where the server's decision matters, e.g. whether a
   2026-07-28 ``tools/call`` creates a task) and refuses a token without that scope (403 with the
   ``WWW-Authenticate`` challenge, the refusal audited);
3. counts the request against its tenant's (and a penalised principal's) rate limits on the async
   path, one Redis round trip shared with concurrent requests: for a ``poll`` route (``tasks/get``)
   the same round trip notes the poll, and a poll sooner than the tenant's poll interval costs an
   extra read (429 with ``Retry-After`` past the limit, the refusal audited);
4. counts a too-early poll towards the principal's ``fast_polling`` flag.

It returns an :class:`Admission` or the :class:`~mcptasks.endpoint.replies.JsonReply` to send.
What a handler raises afterwards is answered by :func:`failure` through the one error table
(:mod:`mcptasks.endpoint.errors`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcptasks.audit import watch
from mcptasks.endpoint import errors
from mcptasks.endpoint.replies import JsonReply
from mcptasks.protocol import jsonrpc
from mcptasks.protocol.dispatch import Dispatcher, Route
from mcptasks.protocol.errors import INVALID_REQUEST, McpError
from mcptasks.protocol.messages import TASK_ID_PATTERN
from mcptasks.tasks import selectors
from tenants import ratelimit
from tenants.auth import AuthContext, insufficient_scope
from tenants.exceptions import QuotaExceeded, RateLimited
from tenants.infra.coalesce import SingleFlight
from tenants.selectors import TenantRow, limits_of, usable_tenant_row

_TASK_ID = re.compile(TASK_ID_PATTERN)

#: Reads of one tenant's limits under way in this process: concurrent requests share them.
_tenant_reads: SingleFlight[int, TenantRow] = SingleFlight()


@dataclass(frozen=True)
class Admission:
    """A request let through: its route (None: unknown to the table, the dispatcher answers
    -32601), the scope and rate class it was admitted under, and whether it was a poll sooner
    than the task's poll interval."""

    route: Route | None
    scope: str | None
    op_class: str
    fast_poll: bool


def polled_task_id(route: Route | None, params: Any) -> str | None:
    """The well-formed task id a polling request (its route's ``poll``) names, else None.

    Only a string of the task-id form is ever used (it is hashed into a Redis key, never used as
    one): anything else is not a poll and the handler answers it (-32602).
    """
    if route is None or not route.poll or not isinstance(params, dict):
        return None
    task_id = params.get("taskId")
    return task_id if isinstance(task_id, str) and _TASK_ID.fullmatch(task_id) else None


async def admit(
    *, table: Dispatcher[Any], ctx: Any, auth: AuthContext, method: str, params: Any,
    request_id: str | int, resource_url: Callable[[], str], initialized: bool = True, era: str = errors.SESSION_ERA,
) -> Admission | JsonReply:
    """Admit one request or say how to refuse it (see the module docstring for the order).

    ``ctx``: the era's handler context, passed to a route's own admission rule. ``initialized``:
    False while the request's session has not sent ``notifications/initialized`` (only the
    session-based era has sessions). ``resource_url``: gives the protected resource named in a
    scope challenge (only a refusal needs it).
    """
    route = table.route(method)
    if not initialized and route is not None and not route.before_init:
        # The method table says what may run before notifications/initialized (ping); the
        # official SDK servers refuse the rest the same way.
        error = McpError(INVALID_REQUEST, "Invalid Request: send notifications/initialized before other requests")
        return JsonReply(400, jsonrpc.error_response(request_id, error))
    scope, op_class = route.admission_rules(ctx, params) if route is not None else (None, "other")
    if scope and not auth.has_scope(scope):
        await watch.arefused(auth=auth, action="auth.scope_refused", data={"method": method[:64], "scope": scope})
        refusal = insufficient_scope(scope=scope, resource_url=resource_url())
        # The request was parsed: answer it as a JSON-RPC error response carrying its id.
        return JsonReply(refusal.status, jsonrpc.with_id(refusal.body, request_id), refusal.headers)
    try:
        too_soon = await _count(auth=auth, op_class=op_class, polled=polled_task_id(route, params))
    except RateLimited as exc:
        await watch.arefused(auth=auth, action="ratelimit.refused",
                             data={"method": method[:64], "class": exc.op_class, "limit": exc.limit})
        error, status, headers = errors.answer(exc, era=era)
        return JsonReply(status, jsonrpc.error_response(request_id, error), headers)
    if too_soon:
        await watch.afast_poll(auth=auth)
    return Admission(route=route, scope=scope, op_class=op_class, fast_poll=too_soon)


async def _count(*, auth: AuthContext, op_class: str, polled: str | None) -> bool:
    """Count the request (and note a poll) in one Redis round trip; whether the poll came too soon."""
    tenant_id = auth.tenant_id
    usable = usable_tenant_row(tenant_id=tenant_id)
    if usable is None:
        # Never read, or lapsed (no request came while they were due): one request reads the
        # tenant's limits and the others in flight wait for that read.
        row = await _tenant_reads.run(tenant_id, lambda: _read_limits(tenant_id))
    else:
        row, due = usable
        if due:
            # Re-read in the background, once, before they lapse; requests go on with these.
            _tenant_reads.start(tenant_id, lambda: _read_limits(tenant_id))
    return await ratelimit.acount_request(
        auth=auth, op_class=op_class, polled_task_id=polled,  # type: ignore[arg-type]
        poll_interval_ms=limits_of(row).poll_interval_ms, row=row,
    )


async def _read_limits(tenant_id: int) -> TenantRow:
    return await selectors.atenant_row(tenant_id=tenant_id)


async def failure(
    exc: Exception, *, auth: AuthContext, method: str, era: str = errors.SESSION_ERA
) -> tuple[McpError, int, dict[str, str]] | None:
    """How to answer what a handler raised (the error table's answer, a quota refusal audited),
    or None when the table does not know it: a crash for the caller to re-raise."""
    if errors.rule_for(exc) is None:
        return None
    if isinstance(exc, QuotaExceeded):
        await watch.arefused(auth=auth, action="quota.refused",
                             data={"method": method[:64], "reason": exc.message[:200]})
    return errors.answer(exc, era=era)
