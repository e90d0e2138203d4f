"""Opaque pagination cursors of ``tasks/list`` and the static ``*/list`` results: a small JSON
object signed with the project's key.

A cursor carries no timestamp (nothing reads one): the same page always has the same cursor, so
two identical requests get identical results. A cursor signed before that (Django's
``signing.dumps``, with a timestamp) is still read, so a client walking a list across an upgrade
is not refused. Anything else (forged, truncated, signed for another salt) is an
``Invalid cursor`` error (-32602).
"""

from __future__ import annotations

from typing import Any

from django.core import signing

from mcptasks.protocol.errors import invalid_params


def sign(payload: dict[str, Any], *, salt: str) -> str:
    """``payload`` as a cursor for ``salt``'s lists."""
    # A Signer per call: SECRET_KEY is read when it is used (tests and key rotation change it).
    return signing.Signer(salt=salt).sign_object(payload)


def read(cursor: str, *, salt: str) -> dict[str, Any]:
    """The payload of ``cursor``, a dict; raises :class:`McpError` (-32602) if it is not one of ours."""
    # Told apart by shape, not by trying one then the other: the timestamped format is signed with
    # the same key and salt, so a plain Signer accepts one and then fails to decode "payload:time".
    parts = cursor.count(":")
    try:
        if parts == 1:
            data = signing.Signer(salt=salt).unsign_object(cursor)
        elif parts == 2:
            data = signing.loads(cursor, salt=salt)  # signed with a timestamp, before this format
        else:
            raise signing.BadSignature
    except (signing.BadSignature, ValueError):
        raise invalid_params("Invalid cursor") from None
    if not isinstance(data, dict):
        raise invalid_params("Invalid cursor")
    return data
