"""Re-verifying a built-in token's cached verdict by what it was decided from.

Every process re-verifies each token it serves every ``AUTH_CACHE_S`` (a second by default), so
that revocation, a disabled tenant or narrowed scopes apply everywhere within that time. The
verification (:func:`tenants.auth.authenticate`) is an ORM query over five tables and the
principal's look-up: about 3 ms of Python a token on a thread beside the event loop, holding the
GIL against it (issue 27: a web process serving 20 tenants' tokens spent a sixth of its samples
there, and made a third fewer creations than one serving one token).

:func:`fingerprint_sql` reads, in one statement, every row and column the verdict is decided
from: the token, its application, the application's tenant link, the tenant's id, slug and
``active``, the linked principal, the token's user and that user's membership of the tenant,
and the principal the verdict named. Whole rows are compared (as digests: no secret's hash is
kept) where a row holds no counter, so a column added later is covered too; the tenant and
principals, whose rows carry task counters that change with every task, are compared by the
columns a verdict reads. A cached verdict whose fingerprint is unchanged is still the verdict a
full verification would reach; any difference (or no row, or no fingerprint) means a full
verification.

The fingerprint kept with a verdict is one read before that verdict's own verification and
found again, unchanged, after it (:func:`reusable_after`): an edit made while a verification
ran can never leave a verdict paired with the fingerprint of the state after the edit.

PostgreSQL only (``row::text``); elsewhere every re-verification is a full one.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

from django.db import connection

#: The principal columns a verdict reads (a principal's row also counts its running tasks).
_PRINCIPAL_COLUMNS = ("id", "tenant_id", "kind", "issuer", "identifier", "name")
#: The tenant columns a verdict reads (its row also holds limits and counters).
_TENANT_COLUMNS = ("id", "slug", "active")


def token_checksum(token: str) -> str:
    """The stored checksum of a built-in access token (django-oauth-toolkit's ``token_checksum``)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def is_builtin(token: str) -> bool:
    """Whether a bearer ``token`` is one of the built-in server's (an external JWT has three parts;
    no token at all is neither)."""
    return bool(token) and token.count(".") != 2


@functools.cache
def fingerprint_sql() -> str | None:
    """The fingerprint statement (``%s`` parameters: the token's checksum, then the principal id
    the cached verdict named, or None), answering at most one row; None off PostgreSQL."""
    if connection.vendor != "postgresql":
        return None
    from django.contrib.auth import get_user_model
    from oauth2_provider.models import get_access_token_model, get_application_model

    from tenants.models import Principal, Tenant, TenantApplication, TenantMembership

    q = connection.ops.quote_name

    def table(model: Any) -> str:
        return q(model._meta.db_table)

    def col(model: Any, name: str) -> str:
        return q(model._meta.get_field(name).column)

    def cols(alias: str, model: Any, names: tuple[str, ...]) -> str:
        return ", ".join(f"{alias}.{col(model, n if n != 'tenant_id' else 'tenant')}" for n in names)

    token, app, user = get_access_token_model(), get_application_model(), get_user_model()
    link, member = TenantApplication, TenantMembership
    # Identifiers come from the models' metadata; the two values are bound parameters.
    return (
        f"WITH k (checksum, principal) AS (SELECT CAST(%s AS text), CAST(%s AS bigint)) "  # noqa: S608
        f"SELECT k.principal, md5(t::text), md5(a::text), md5(l::text), {cols('tn', Tenant, _TENANT_COLUMNS)}, "
        f"{cols('lp', Principal, _PRINCIPAL_COLUMNS)}, md5(u::text), md5(m::text), "
        f"{cols('p', Principal, _PRINCIPAL_COLUMNS)} "
        f"FROM k JOIN {table(token)} t ON t.{col(token, 'token_checksum')} = k.checksum "
        f"LEFT JOIN {table(app)} a ON a.{col(app, 'id')} = t.{col(token, 'application')} "
        f"LEFT JOIN {table(link)} l ON l.{col(link, 'application')} = a.{col(app, 'id')} "
        f"LEFT JOIN {table(Tenant)} tn ON tn.{col(Tenant, 'id')} = l.{col(link, 'tenant')} "
        f"LEFT JOIN {table(Principal)} lp ON lp.{col(Principal, 'id')} = l.{col(link, 'principal')} "
        f"LEFT JOIN {table(user)} u ON u.{q(str(user._meta.pk.column))} = t.{col(token, 'user')} "
        f"LEFT JOIN {table(member)} m ON m.{col(member, 'tenant')} = l.{col(link, 'tenant')} "
        f"AND m.{col(member, 'user')} = t.{col(token, 'user')} "
        f"LEFT JOIN {table(Principal)} p ON p.{col(Principal, 'id')} = k.principal"
    )


def reusable_after(before: tuple[Any, ...] | None, after: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """The fingerprint to keep with a verdict verified between reading ``before`` (with the
    previous verdict's principal) and ``after`` (with the new one's): ``after`` if nothing the
    verdict reads changed meanwhile and the two name the same principal, else None."""
    return after if after is not None and before == after else None
