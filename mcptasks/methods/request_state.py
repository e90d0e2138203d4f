"""``requestState`` for InputRequiredResult rounds: signed, bound to the caller, short-lived.

The state names the durable run (a plain-request task row) the next round continues. It is
signed with the project's secret key (Django's ``signing``, HMAC-SHA256) under a salt of its
own, so a client can neither forge nor alter it, and it carries the tenant and principal it
was issued to: replaying it as someone else fails exactly like a tampered one.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.core import signing

from mcptasks.protocol.errors import invalid_params
from tenants.auth import AuthContext

_SALT = "mcptasks.methods.era2026.requestState"
#: How long a round may wait for the client's answer (as long as the run behind it waits,
#: ``tasks.PLAIN_RUN_TTL_S``).
MAX_AGE_S = 600


@dataclass(frozen=True)
class RoundState:
    """What a verified ``requestState`` says: which run, which round, which tool."""

    task_id: str
    tool: str
    round: int
    #: "request": a plain run; "task": a task that gathers input before it is handed over.
    kind: str = "request"


def issue(*, auth: AuthContext, task_id: str, tool: str, round_: int, kind: str = "request") -> str:
    """A fresh signed state for the caller (a nonce makes every round's state distinct)."""
    payload = {
        "t": task_id, "n": tool, "r": round_, "k": kind, "x": secrets.token_urlsafe(6),
        "tn": auth.tenant_id, "p": auth.principal_id,
    }
    return signing.dumps(payload, salt=_SALT, compress=True)


def verify(*, auth: AuthContext, state: str, tool: str) -> RoundState:
    """The round a state stands for, or -32602 if it was altered, expired or is not the caller's."""
    try:
        data = signing.loads(state, salt=_SALT, max_age=MAX_AGE_S)
    except signing.BadSignature:
        raise invalid_params("Invalid requestState: it failed integrity verification") from None
    if (
        not isinstance(data, dict)
        or data.get("tn") != auth.tenant_id
        or data.get("p") != auth.principal_id
        or data.get("n") != tool
        or not isinstance(data.get("t"), str)
        or not isinstance(data.get("r"), int)
        or data.get("k", "request") not in ("request", "task")
    ):
        # Another caller's (or another tool's) state: indistinguishable from a forged one.
        raise invalid_params("Invalid requestState: it failed integrity verification")
    return RoundState(task_id=data["t"], tool=tool, round=data["r"], kind=data.get("k", "request"))
