"""Sessions: opening one (bounded per principal), its activity, log level and subscriptions."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from mcptasks import conf
from mcptasks.models import McpSession
from mcptasks.protocol.era2026 import VERSION as ERA2026_VERSION
from mcptasks.protocol.errors import invalid_params
from mcptasks.protocol.messages import LOG_LEVELS
from mcptasks.streams import signals
from mcptasks.tasks import auditing
from tenants.auth import AuthContext
from tenants.exceptions import QuotaExceeded
from tenants.models import Principal


def check_client_metadata(*, client_info: Any, capabilities: Any) -> None:
    """Refuse (-32602) a ``clientInfo`` or capabilities object larger than ``CLIENT_METADATA_MAX_BYTES``."""
    limit = conf.get().CLIENT_METADATA_MAX_BYTES
    for name, value in (("clientInfo", client_info), ("capabilities", capabilities)):
        size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        if size > limit:
            raise invalid_params(f"Invalid params: {name} is too large ({size} bytes; the limit is {limit} bytes)",
                                 {"field": name, "limit": limit})


def open_session(
    *, auth: AuthContext, protocol_version: str, client_info: dict[str, Any], capabilities: dict[str, Any]
) -> McpSession:
    """Create the session an ``initialize`` opens, bound to the caller's principal.

    Refused with -32602 when the client metadata is over ``CLIENT_METADATA_MAX_BYTES`` and with
    :class:`QuotaExceeded` (-32010) when the principal holds ``MAX_SESSIONS_PER_PRINCIPAL`` live
    sessions. The count runs under a lock on the principal's row, so concurrent ``initialize``
    requests (in any process) cannot overshoot it.
    """
    check_client_metadata(client_info=client_info, capabilities=capabilities)
    cap = conf.get().MAX_SESSIONS_PER_PRINCIPAL
    with transaction.atomic():
        if cap > 0:
            # FOR NO KEY UPDATE: it serialises the principal's initializes as well, and the foreign key
            # checks of the principal's task creations meanwhile (FOR KEY SHARE) need not wait for it.
            Principal.objects.select_for_update(no_key=True).filter(pk=auth.principal_id).exists()
            held = live_sessions(principal_id=auth.principal_id, now=timezone.now()).count()
            if held >= cap:
                raise QuotaExceeded(
                    f"Too many sessions: this principal holds {held} live sessions (the limit is {cap}); "
                    "end one with HTTP DELETE or let idle ones expire",
                    {"limit": cap, "scope": "principal", "resource": "sessions"},
                )
        session = McpSession.objects.create(
            tenant_id=auth.tenant_id,
            principal_id=auth.principal_id,
            protocol_version=protocol_version,
            client_info=client_info,
            client_capabilities=capabilities,
        )
    auditing.record_audit(auth=auth, action="session.open", data={"protocolVersion": protocol_version})
    return session


def live_sessions(*, principal_id: int, now: dt.datetime) -> QuerySet[McpSession]:
    """The principal's sessions that count against ``MAX_SESSIONS_PER_PRINCIPAL``.

    Not ended, not idle past ``SESSION_IDLE_TIMEOUT_S``, not an uninitialized one past
    ``SESSION_INIT_TIMEOUT_S`` (cleanup deletes those), and not the row of a 2026-07-28 request
    (those stand for one request each and expire with it).
    """
    s = conf.get()
    return (
        McpSession.objects.filter(
            principal_id=principal_id,
            ended_at__isnull=True,
            last_seen_at__gt=now - dt.timedelta(seconds=s.SESSION_IDLE_TIMEOUT_S),
        )
        .exclude(protocol_version=ERA2026_VERSION)
        .exclude(initialized=False, created_at__lte=now - dt.timedelta(seconds=s.SESSION_INIT_TIMEOUT_S))
    )


def mark_initialized(*, session: McpSession) -> None:
    """``notifications/initialized`` arrived."""
    McpSession.objects.filter(pk=session.pk).update(initialized=True, last_seen_at=timezone.now())


def end_session(*, session: McpSession) -> None:
    """End a session (HTTP DELETE): later requests with its id get 404, its streams close."""
    McpSession.objects.filter(pk=session.pk, ended_at__isnull=True).update(ended_at=timezone.now())
    signals.signal_session(session.pk, "ended")


def set_log_level(*, session: McpSession, level: str) -> None:
    """``logging/setLevel``."""
    McpSession.objects.filter(pk=session.pk).update(log_level=level)


def set_subscription(*, session: McpSession, uri: str, subscribed: bool) -> None:
    """``resources/subscribe`` and ``resources/unsubscribe``."""
    subs = [u for u in session.subscriptions if u != uri]
    if subscribed:
        subs.append(uri)
    McpSession.objects.filter(pk=session.pk).update(subscriptions=subs)


#: Session activity is recorded at most this often (idle cleanup works in hours).
TOUCH_INTERVAL_S = 60.0


def session_needs_touch(*, session: McpSession) -> bool:
    """Whether :func:`touch_session` would write (no I/O: callers skip the hop otherwise)."""
    last = session.last_seen_at
    return last is None or (timezone.now() - last).total_seconds() >= TOUCH_INTERVAL_S


def touch_session(*, session: McpSession) -> None:
    """Record activity on a session (at most once a minute) so idle cleanup spares it."""
    if session_needs_touch(session=session):
        now = timezone.now()
        McpSession.objects.filter(pk=session.pk).update(last_seen_at=now)
        session.last_seen_at = now


def log_level_allows(session_level: str, level: str) -> bool:
    """Whether a message at ``level`` passes the session's ``logging/setLevel`` threshold."""
    try:
        return LOG_LEVELS.index(level) >= LOG_LEVELS.index(session_level)
    except ValueError:
        return True
