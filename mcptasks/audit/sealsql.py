"""The audit sealer's write on PostgreSQL: one statement, under the sealer's lock, only onto
chains that have not moved since the pass read them (see :func:`mcptasks.audit.trail.seal`)."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from mcptasks.models import AuditAnchor, AuditEvent


def write_if_current(events: list[AuditEvent], *, bases: dict[int, int], anchors: list[AuditAnchor],
                     lock: tuple[int, int]) -> bool:
    """PostgreSQL: store the seals of ``events`` and ``anchors`` in one statement, under the
    sealer's advisory lock, if every chain's newest sealed event is still the one at ``bases``
    (chain -> sequence number) and every event is still unsealed; else write nothing. Whether
    it wrote. Its transaction lasts one statement and a COMMIT."""
    quote = connection.ops.quote_name
    table, pk = quote(AuditEvent._meta.db_table), quote(str(AuditEvent._meta.pk.column))
    anchor_table = quote(AuditAnchor._meta.db_table)
    chain_seq, sealed_at = quote("chain_seq"), quote("sealed_at")
    columns = ", ".join(quote(c) for c in ("chain", "seq", "head", "kind", "created_at", "signature"))
    sql = f"""
        WITH gate AS MATERIALIZED (
            SELECT pg_try_advisory_xact_lock(%(lock_a)s, %(lock_b)s) AND NOT EXISTS (
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
    params: dict[str, Any] = {
        "lock_a": lock[0], "lock_b": lock[1], "chains": list(bases), "bases": list(bases.values()),
        "at": events[0].sealed_at, "ids": [ev.pk for ev in events], "seqs": [ev.chain_seq for ev in events],
        "prevs": [ev.prev_hash for ev in events], "hashes": [ev.hash for ev in events],
        "a_chains": [a.chain for a in anchors], "a_seqs": [a.seq for a in anchors],
        "a_heads": [a.head for a in anchors], "a_kinds": [a.kind for a in anchors],
        "a_ats": [a.created_at for a in anchors], "a_sigs": [a.signature for a in anchors],
    }
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql, params)
        ok, written = cur.fetchone()
        if ok and written == len(events):
            return True
        # The lock was taken, a chain moved, or an event went (every event or none is sealed).
        transaction.set_rollback(True)
        return False
