"""The sessions this process last read live, for task creations that need not read them again (issue 27).

What a task creation needs of its session does not change once the session is initialized (its
id, owner and protocol version), and the uncounted creation statement checks that the session is
still live as it writes (:mod:`mcptasks.models.creationsql`). A creation on a session remembered
here therefore skips the read of its session: one round trip of two. Every other path reads the
session first (:func:`mcptasks.tasks.creation.acreate_task`). Only sessions the caller was shown
to own are remembered, so a client cannot fill this with ids of its choosing; another
principal's id is never served from here.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Any

from django.db import models

from mcptasks.models import McpSession
from mcptasks.protocol.era2026 import VERSION as ERA2026_VERSION
from tenants.auth import AuthContext


class SessionGone(Exception):
    """A session taken from :func:`remembered_session` turned out not to be the caller's live
    one when its request wrote (the transport answers 404, as for a session never found)."""


class _RememberedSessions:
    """This process's last sessions read live (:func:`remember_session`), by id: their small
    columns' values (:func:`_session_attnames`), most recently used last, at most ``SIZE``."""

    SIZE = 10_000

    def __init__(self) -> None:
        self.rows: OrderedDict[str, tuple[Any, ...]] = OrderedDict()


_remembered = _RememberedSessions()

#: The attribute set on a session built from :data:`_remembered`: not read for this request.
_UNREAD = "_mcptasks_remembered"


def remember_session(session: McpSession) -> None:
    """Remember ``session`` (just read live) for :func:`remembered_session`, if it may be: an
    initialized session of the session-based era."""
    if not session.initialized or session.protocol_version == ERA2026_VERSION or getattr(session, _UNREAD, False):
        return
    rows = _remembered.rows
    rows[session.pk] = tuple(getattr(session, name) for name in _session_attnames())
    rows.move_to_end(session.pk)
    while len(rows) > _RememberedSessions.SIZE:
        rows.popitem(last=False)


def remembered_session(*, session_id: str, auth: AuthContext) -> McpSession | None:
    """The caller's session ``session_id`` as this process last read it live, unread now, or
    None. The caller must not rely on it being live: see :func:`session_unread`."""
    values = _remembered.rows.get(session_id)
    if values is None:
        return None
    session = McpSession.from_db("default", list(_session_attnames()), list(values))
    if session.tenant_id != auth.tenant_id or session.principal_id != auth.principal_id:
        return None  # another principal's id: read (and refused) as any unknown session is
    setattr(session, _UNREAD, True)
    return session


def session_unread(session: McpSession) -> bool:
    """Whether ``session`` came from :func:`remembered_session`: not read for this request, so
    whatever it writes must check the session is still live (or read it first)."""
    return bool(getattr(session, _UNREAD, False))


def forget_session(session_id: str) -> None:
    """Drop ``session_id`` from what this process remembers (it was found gone or ended)."""
    _remembered.rows.pop(session_id, None)


@functools.cache
def _session_attnames() -> tuple[str, ...]:
    """The columns remembered: not the JSON ones (the client's info and capabilities, the
    subscriptions), which a client sizes (up to a request body each) and a creation never reads.
    A remembered session has them deferred."""
    return tuple(f.attname for f in McpSession._meta.concrete_fields if not isinstance(f, models.JSONField))
