"""The audit sealer's write on PostgreSQL: one statement, under the sealer's lock, only onto
chains that have not moved since the pass read them (see :func:`mcptasks.audit.trail.seal`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection, transaction

from mcptasks import conf
from mcptasks.db import prepared
from mcptasks.models import AuditAnchor, AuditEvent

_statement: str | None = None


@dataclass(frozen=True, slots=True)
class Seal:
    """The seal columns of one event (``pk``), as a pass computed them."""

    pk: int
    chain_seq: int
    prev_hash: str
    hash: str
    sealed_at: dt.datetime


@contextmanager
def sealing_turn(lock: tuple[int, int]) -> Iterator[bool]:
    """Whether this pass may seal: without a pooler, the sealer's advisory lock taken for the
    session (``pg_try_advisory_lock``) for the whole pass and released after, so concurrent
    passes of other processes skip at once instead of hashing the same events. The lock is no
    transaction: a process that vanishes mid-pass releases it with its connection. Behind a
    transaction pooler a session lock could stay on a server connection another client gets:
    every pass goes on, and only the write's transaction lock (:func:`write_if_current`)
    decides."""
    if conf.get().DB_POOLER != "none":
        yield True
        return
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s, %s)", list(lock))
        held = bool(cur.fetchone()[0])
    try:
        yield held
    finally:
        if held:
            try:
                with connection.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s, %s)", list(lock))
            except DatabaseError:
                pass  # the connection went, and the lock with it


def write_if_current(events: list[Seal], *, bases: dict[int, int], anchors: list[AuditAnchor],
                     lock: tuple[int, int]) -> bool:
    """PostgreSQL: store the seals of ``events`` and ``anchors`` in one statement, once the
    sealer's advisory lock ``lock`` is taken (``pg_try_advisory_xact_lock``), if every chain's
    newest sealed event is still the one at ``bases`` (chain -> sequence number) and every
    event is still unsealed; else write nothing. Whether it wrote. Its transaction is the lock,
    the statement and a COMMIT: no Python work between."""
    params: dict[str, Any] = {
        "chains": list(bases), "bases": list(bases.values()),
        "at": events[0].sealed_at, "ids": [ev.pk for ev in events], "seqs": [ev.chain_seq for ev in events],
        "prevs": [ev.prev_hash for ev in events], "hashes": [ev.hash for ev in events],
        "a_chains": [a.chain for a in anchors], "a_seqs": [a.seq for a in anchors],
        "a_heads": [a.head for a in anchors], "a_kinds": [a.kind for a in anchors],
        "a_ats": [a.created_at for a in anchors], "a_sigs": [a.signature for a in anchors],
    }
    with transaction.atomic():
        # The lock first, in a statement of its own: the write's snapshot is then taken once
        # the lock is held, so it sees every seal committed by the sealer before (a snapshot
        # taken before the lock could miss one and extend a chain from a stale head).
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", list(lock))
            if not cur.fetchone()[0]:
                return False
        # Prepared with binary arrays: nothing slow runs between the lock and the write.
        [(current, written)] = prepared.fetchall(_build(), params)
        if current and written == len(events):
            return True
        # A chain moved, or an event went: every event or none is sealed.
        transaction.set_rollback(True)
        return False


def _build() -> str:
    """The statement (built once: only quoted model metadata is formatted in)."""
    global _statement
    if _statement is not None:
        return _statement
    quote = connection.ops.quote_name
    table, pk = quote(AuditEvent._meta.db_table), quote(str(AuditEvent._meta.pk.column))
    anchor_table = quote(AuditAnchor._meta.db_table)
    chain_seq, sealed_at = quote("chain_seq"), quote("sealed_at")
    columns = ", ".join(quote(c) for c in ("chain", "seq", "head", "kind", "created_at", "signature"))
    sql = f"""
        WITH gate AS MATERIALIZED (
            SELECT NOT EXISTS (
                SELECT 1 FROM unnest(%(chains)s::bigint[], %(bases)s::bigint[]) AS h (chain, seq)
                WHERE EXISTS (SELECT 1 FROM {table} e WHERE e.{quote("chain")} = h.chain AND e.{chain_seq} > h.seq)
            ) AS ok
        ),
        sealed AS (
            UPDATE {table} a SET {chain_seq} = v.seq, {quote("prev_hash")} = v.prev, {quote("hash")} = v.hash,
                   {sealed_at} = %(at)s
            FROM unnest(%(ids)s::bigint[], %(seqs)s::bigint[], %(prevs)s::text[], %(hashes)s::text[])
                AS v (id, seq, prev, hash)
            WHERE a.{pk} = v.id AND a.{sealed_at} IS NULL AND (SELECT ok FROM gate)
            RETURNING a.{pk}
        ),
        anchored AS (
            INSERT INTO {anchor_table} ({columns})
            SELECT * FROM unnest(%(a_chains)s::bigint[], %(a_seqs)s::bigint[], %(a_heads)s::text[],
                                 %(a_kinds)s::text[], %(a_ats)s::timestamptz[], %(a_sigs)s::text[])
            WHERE (SELECT ok FROM gate)
        )
        SELECT (SELECT ok FROM gate), (SELECT count(*) FROM sealed)
    """  # noqa: S608 (quoted names only; every value is a parameter)
    _statement = sql
    return sql
