"""The audit trail: append-only events, sealed into keyed hash chains, anchored, verifiable.

Appending is a plain INSERT (:func:`append`): no lock, no read, so task traffic never serialises on
the audit log. A *sealer* (:func:`seal`, run every ``AUDIT_SEAL_INTERVAL_S`` by workers and the
embedded worker's web process, others only as a backstop (:mod:`~.housekeeping`), under an advisory
lock of its own on PostgreSQL) then chains the committed, unsealed events of each *chain* (one per
tenant, ``0`` for events of no tenant) in id order: each gets the next ``chain_seq``, the previous
event's hash and its own hash, an HMAC-SHA256 (key ``MCPTASKS_AUDIT_KEY``, separate from
``SECRET_KEY``) over its id, time, chain, sequence number, principal, action, task id, data and the
previous hash. An event that commits late (its transaction outlived a sealing pass) is simply
chained in the next pass: the chain's order is the sealer's, so it never forks.

Every pass that advances a chain records a signed *anchor* (the chain's head sequence number and
hash); anchors can be exported and kept elsewhere. :func:`verify` recomputes a chain and names the
first broken event: an edited or back-dated row fails its HMAC, a row deleted from the middle breaks
the links, newest rows deleted leave an anchor pointing past the chain's end, and recomputing the
hashes needs the key. :func:`prune` deletes old events and records a signed *prune anchor* from
which verification starts.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from mcptasks.audit import sealsql
from mcptasks.models import AuditAnchor, AuditEvent

#: pg_try_advisory_xact_lock key of the sealer (one sealer at a time across all processes).
SEAL_LOCK = (0x4D435054, 0x5345414C)  # "MCPT", "SEAL"


def _key() -> bytes:
    raw = str(getattr(settings, "AUDIT_KEY", "") or "")
    if raw:
        return raw.encode()
    # Development only (system check mcptasks.W002 warns in production): a key derived from
    # SECRET_KEY still keeps people without the settings from recomputing the chain.
    return hashlib.sha256(b"mcptasks-audit:" + str(settings.SECRET_KEY).encode()).digest()


def _mac(body: str) -> str:
    mac = _keyed_mac(str(getattr(settings, "AUDIT_KEY", "") or ""), str(settings.SECRET_KEY)).copy()
    mac.update(body.encode())
    return mac.hexdigest()


@functools.lru_cache(maxsize=1)
def _keyed_mac(audit_key: str, secret_key: str) -> hmac.HMAC:
    """The HMAC keyed by the settings named (keyed once, not for each of a pass's events)."""
    return hmac.new(_key(), digestmod=hashlib.sha256)


def _iso(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat()


def event_hash(*, event_id: int, created_at: dt.datetime, chain: int, seq: int, principal: int | None,
               action: str, task_id: str, data: Any, prev: str) -> str:
    """The keyed hash of one sealed event (everything it says, its place and its predecessor)."""
    body = json.dumps(
        {"id": event_id, "at": _iso(created_at), "chain": chain, "seq": seq, "p": principal, "a": action,
         "task": task_id, "d": data, "prev": prev},
        sort_keys=True, separators=(",", ":"), default=str,
    )
    return _mac(body)


def anchor_signature(*, chain: int, seq: int, head: str, created_at: dt.datetime, kind: str) -> str:
    """The keyed signature of an anchor."""
    return _mac(f"anchor|{kind}|{chain}|{seq}|{head}|{_iso(created_at)}")


# --- appending -------------------------------------------------------------------------------


def event(*, tenant_id: int | None, principal_id: int | None, action: str, task_id: str = "",
          data: dict[str, Any] | None = None) -> AuditEvent:
    """An unsaved event (for :func:`append_many`)."""
    return AuditEvent(
        tenant_id=tenant_id, principal_id=principal_id, chain=tenant_id or 0, principal_ref=principal_id,
        action=action, task_id=task_id, data=data or {},
    )


def append(*, tenant_id: int | None, principal_id: int | None, action: str, task_id: str = "",
           data: dict[str, Any] | None = None) -> None:
    """Append one event (one INSERT; sealed later)."""
    event(tenant_id=tenant_id, principal_id=principal_id, action=action, task_id=task_id, data=data).save()


async def aappend(*, tenant_id: int | None, principal_id: int | None, action: str, task_id: str = "",
                  data: dict[str, Any] | None = None) -> None:
    """:func:`append` from async code: over the async connection on PostgreSQL (no thread hop;
    appends made at the same time share one INSERT), else through the ORM in a thread.

    If the async write fails it is made through the ORM; should the failed one have committed
    after all (the connection broke after the commit), the event is recorded twice, never lost.
    """
    from asgiref.sync import sync_to_async

    from mcptasks.db import async_sql as fastreads

    fields = event(tenant_id=tenant_id, principal_id=principal_id, action=action, task_id=task_id, data=data)
    if fastreads.available():
        values = {name: getattr(fields, name) for name in _APPEND_FIELDS}
        try:
            await fastreads.insert(AuditEvent, values)
            return
        except fastreads.Unavailable:
            pass
    await sync_to_async(fields.save)()


#: What an append writes (the sealer fills in the rest).
_APPEND_FIELDS = ("tenant_id", "principal_id", "chain", "principal_ref", "action", "task_id", "data", "created_at",
                  "prev_hash", "hash")


def append_many(events: Iterable[AuditEvent]) -> None:
    """Append several events in one statement."""
    batch = list(events)
    if batch:
        AuditEvent.objects.bulk_create(batch)


# --- sealing ---------------------------------------------------------------------------------


#: Unsealed events in id order (the unsealed index); only ever refined, never evaluated itself.
_UNSEALED = AuditEvent.objects.filter(sealed_at__isnull=True).order_by("id")


def _heads(chains: set[int]) -> dict[int, tuple[int, str]]:
    """(last sequence number, its hash) of each chain: its newest sealed event or prune anchor."""
    heads: dict[int, tuple[int, str]] = {c: (0, "") for c in chains}
    for chain in chains:
        # The newest sealed event of the chain: a backward scan of the (chain, chain_seq) unique
        # index that stops at its first row. A MAX(chain_seq) grouped by chain read every sealed
        # event of the chain on every pass, so a pass grew with the tenant's whole history.
        newest = (AuditEvent.objects.filter(chain=chain, chain_seq__isnull=False).order_by("-chain_seq")
                  .values_list("chain_seq", "hash").first())
        if newest is not None and newest[0] is not None:
            heads[chain] = (newest[0], newest[1])
    for anchor in AuditAnchor.objects.filter(chain__in=chains, kind=AuditAnchor.Kind.PRUNE):
        if anchor.seq > heads[anchor.chain][0]:
            heads[anchor.chain] = (anchor.seq, anchor.head)
    return heads


def seal(*, limit: int = 5000, older_than_s: float | None = None) -> int:
    """Chain up to ``limit`` committed unsealed events; returns how many were sealed.

    ``older_than_s``: seal nothing unless the oldest unsealed event is at least that old (a
    backstop for when the processes that seal have stopped); then seal as usual.

    On PostgreSQL the events are read and hashed outside any transaction, then written by one
    statement under the sealer's advisory lock, only if no chain it extends has moved meanwhile
    (:func:`mcptasks.audit.sealsql.write_if_current`): no transaction stays open while Python
    hashes (issue 27: every process's pass sat ``idle in transaction`` for the whole hashing).
    Without a pooler the pass first takes the lock for its session
    (:func:`mcptasks.audit.sealsql.sealing_turn`), so the other processes' passes skip at once
    instead of hashing the same events. Returns 0 at once when another process is sealing, or
    when the heads moved (the next pass chains them). On SQLite writers are serialised by the
    database: one transaction.
    """
    if older_than_s is not None and not _left_unsealed(older_than_s):
        return 0
    if connection.vendor != "postgresql":
        with transaction.atomic():
            chained = _chain_pending(limit=limit)
            if chained is None:
                return 0
            pending, _bases, anchors = chained
            _write_seals(pending)
            AuditAnchor.objects.bulk_create(anchors)
            return len(pending)
    with sealsql.sealing_turn(SEAL_LOCK) as turn:
        chained = _chain_pending(limit=limit) if turn else None
        if chained is None:
            return 0
        pending, bases, anchors = chained
        return len(pending) if sealsql.write_if_current(pending, bases=bases, anchors=anchors, lock=SEAL_LOCK) else 0


def _left_unsealed(seconds: float) -> bool:
    """Whether the oldest unsealed event (the unsealed index's first) is ``seconds`` old."""
    oldest = _UNSEALED.values_list("created_at", flat=True)[:1]
    return any(at <= timezone.now() - dt.timedelta(seconds=seconds) for at in oldest)


def _chain_pending(*, limit: int) -> tuple[list[sealsql.Seal], dict[int, int], list[AuditAnchor]] | None:
    """The seals of the oldest ``limit`` unsealed events (in id order, each after its chain's
    head), the head sequence number each chain had, and the anchors of the new heads; None when
    nothing is unsealed. The events are read as values, not model instances: a pass reads
    thousands, and building each instance cost more than hashing it."""
    rows = list(_UNSEALED.values_list(
        "id", "created_at", "chain", "principal_ref", "action", "task_id", "data")[:limit])
    if not rows:
        return None
    heads = _heads({row[2] for row in rows})
    bases = {chain: seq for chain, (seq, _hash) in heads.items()}
    now = timezone.now()
    pending = []
    for event_id, created_at, chain, principal, action, task_id, data in rows:
        seq, prev = heads[chain]
        digest = event_hash(event_id=event_id, created_at=created_at, chain=chain, seq=seq + 1, principal=principal,
                            action=action, task_id=task_id, data=data, prev=prev)
        pending.append(sealsql.Seal(pk=event_id, chain_seq=seq + 1, prev_hash=prev, hash=digest, sealed_at=now))
        heads[chain] = (seq + 1, digest)
    anchors = [_anchor(chain=c, seq=heads[c][0], head=heads[c][1], at=now, kind=AuditAnchor.Kind.HEAD)
               for c in sorted(bases)]
    return pending, bases, anchors


def _write_seals(events: list[sealsql.Seal]) -> None:
    """Store the seal columns of ``events`` (SQLite: one parameterised UPDATE a row;
    ``bulk_update``'s CASE per column cost about a millisecond of CPU per event)."""
    meta = AuditEvent._meta
    quote = connection.ops.quote_name
    table, pk = quote(meta.db_table), quote(str(meta.pk.column))
    fields = [f for f in meta.concrete_fields if f.name in ("chain_seq", "prev_hash", "hash", "sealed_at")]
    assignments = ", ".join(f"{quote(str(f.column))} = %s" for f in fields)
    sql = f"UPDATE {table} SET {assignments} WHERE {pk} = %s"  # noqa: S608
    rows = [[f.get_db_prep_save(getattr(ev, f.attname), connection) for f in fields] + [ev.pk] for ev in events]
    with connection.cursor() as cur:
        cur.executemany(sql, rows)


def seal_all(*, limit: int = 5000) -> int:
    """Seal until nothing committed is left unsealed (or another process holds the sealer)."""
    total = 0
    while n := seal(limit=limit):
        total += n
    return total


def _anchor(*, chain: int, seq: int, head: str, at: dt.datetime, kind: str) -> AuditAnchor:
    return AuditAnchor(chain=chain, seq=seq, head=head, created_at=at, kind=kind,
                       signature=anchor_signature(chain=chain, seq=seq, head=head, created_at=at, kind=kind))


# --- verifying -------------------------------------------------------------------------------


@dataclass
class Report:
    """What :func:`verify` found for one chain."""

    chain: int
    checked: int = 0
    head_seq: int = 0
    problems: list[str] = field(default_factory=list)
    #: Unsealed events older than the grace period (the sealer is not running, or is behind).
    stale_unsealed: int = 0
    first_broken_id: int | None = None

    @property
    def ok(self) -> bool:
        """Whether the chain verified."""
        return not self.problems

    def _fail(self, message: str, event_id: int | None = None) -> None:
        if event_id is not None and self.first_broken_id is None:
            self.first_broken_id = event_id
        self.problems.append(message)


def chains() -> list[int]:
    """Every chain with events or anchors."""
    found = set(AuditEvent.objects.values_list("chain", flat=True).distinct())
    found |= set(AuditAnchor.objects.values_list("chain", flat=True).distinct())
    return sorted(found)


def verify(*, chain: int, external_anchors: Iterable[dict[str, Any]] = (), unsealed_grace_s: float = 10.0) -> Report:
    """Recompute ``chain`` (a tenant id, or 0); report the first broken event, if any.

    ``external_anchors`` are anchors exported earlier (:func:`export_anchors`) and kept outside
    the database: they detect truncation even when the anchors stored beside the events were
    deleted too.
    """
    report = Report(chain=chain)
    anchors = list(AuditAnchor.objects.filter(chain=chain).order_by("seq", "id"))
    for a in anchors:
        if not hmac.compare_digest(a.signature, anchor_signature(chain=a.chain, seq=a.seq, head=a.head,
                                                                 created_at=a.created_at, kind=a.kind)):
            report._fail(f"anchor {a.pk} (seq {a.seq}) has a bad signature")
    ext = [x for x in external_anchors if int(x.get("chain", -1)) == chain]
    for x in ext:
        at = dt.datetime.fromisoformat(str(x["at"]))
        if not hmac.compare_digest(str(x.get("signature", "")), anchor_signature(
                chain=chain, seq=int(x["seq"]), head=str(x["head"]), created_at=at, kind=str(x["kind"]))):
            report._fail(f"exported anchor at seq {x['seq']} has a bad signature")
    prunes = [a for a in anchors if a.kind == AuditAnchor.Kind.PRUNE]
    expected, prev = (prunes[-1].seq + 1, prunes[-1].head) if prunes else (1, "")
    anchored = {a.seq for a in anchors} | {int(x["seq"]) for x in ext}
    by_seq: dict[int, str] = {}  # hashes at anchored positions only (memory stays bounded)
    for ev in _sealed_events(chain):
        report.checked += 1
        seq = int(ev.chain_seq or 0)
        if seq < expected:
            if not prunes or seq > prunes[-1].seq:
                report._fail(f"event {ev.pk}: sequence number {seq} repeated", ev.pk)
            else:
                report._fail(f"event {ev.pk}: seq {seq} should have been pruned", ev.pk)
            continue
        if seq != expected:
            report._fail(f"event {ev.pk}: events {expected}..{seq - 1} of the chain are missing (deleted)", ev.pk)
        if ev.prev_hash != prev:
            report._fail(f"event {ev.pk} (seq {seq}): link to the previous event is broken", ev.pk)
        want = event_hash(event_id=ev.pk, created_at=ev.created_at, chain=ev.chain, seq=seq,
                          principal=ev.principal_ref, action=ev.action, task_id=ev.task_id, data=ev.data,
                          prev=ev.prev_hash)
        if not hmac.compare_digest(ev.hash, want):
            report._fail(f"event {ev.pk} (seq {seq}): contents or time changed since it was sealed", ev.pk)
        if seq in anchored:
            by_seq[seq] = ev.hash
        prev = ev.hash
        expected = seq + 1
    report.head_seq = expected - 1
    for seq, head, where in [(a.seq, a.head, f"anchor {a.pk}") for a in anchors if a.kind == AuditAnchor.Kind.HEAD] + [
        (int(x["seq"]), str(x["head"]), "exported anchor") for x in ext
    ]:
        if seq > report.head_seq:
            report._fail(f"{where} records seq {seq} but the chain ends at {report.head_seq}: newest events deleted")
        elif seq in by_seq and not hmac.compare_digest(by_seq[seq], head):
            report._fail(f"{where} records another hash for seq {seq}: the chain was rewritten")
    cutoff = timezone.now() - dt.timedelta(seconds=unsealed_grace_s)
    report.stale_unsealed = AuditEvent.objects.filter(chain=chain, sealed_at__isnull=True,
                                                      created_at__lt=cutoff).count()
    return report


def export_anchors(*, chain: int | None = None) -> list[dict[str, Any]]:
    """The newest anchor of each chain, as JSON-ready dicts to keep outside the database."""
    qs = AuditAnchor.objects.all() if chain is None else AuditAnchor.objects.filter(chain=chain)
    newest: dict[int, AuditAnchor] = {}
    for a in qs.order_by("chain", "seq", "id"):
        newest[a.chain] = a
    return [{"chain": a.chain, "seq": a.seq, "head": a.head, "kind": a.kind, "at": _iso(a.created_at),
             "signature": a.signature} for a in newest.values()]


def thin_anchors(*, older_than: dt.timedelta) -> int:
    """Delete head anchors older than ``older_than``, except the newest of each chain."""
    cutoff = timezone.now() - older_than
    newest = AuditAnchor.objects.filter(kind=AuditAnchor.Kind.HEAD).values("chain").annotate(m=Max("id"))
    keep = [row["m"] for row in newest]
    return int(AuditAnchor.objects.filter(kind=AuditAnchor.Kind.HEAD, created_at__lt=cutoff)
               .exclude(pk__in=keep).delete()[0])


# --- pruning ---------------------------------------------------------------------------------


def prune(*, older_than: dt.timedelta) -> int:
    """Delete sealed events older than ``older_than`` (and their superseded anchors).

    Each chain keeps a signed prune anchor at the last deleted event, from which verification
    starts, so the remaining chain stays verifiable. Returns the events deleted.
    """
    cutoff = timezone.now() - older_than
    deleted = 0
    for chain in chains():
        with transaction.atomic():
            last = (AuditEvent.objects.filter(chain=chain, sealed_at__isnull=False, created_at__lt=cutoff)
                    .order_by("-chain_seq").values_list("chain_seq", "hash").first())
            if last is None:
                continue
            seq, head = int(last[0] or 0), str(last[1])
            _anchor(chain=chain, seq=seq, head=head, at=timezone.now(), kind=AuditAnchor.Kind.PRUNE).save()
            n, _ = AuditEvent.objects.filter(chain=chain, chain_seq__lte=seq).delete()
            AuditAnchor.objects.filter(chain=chain, seq__lt=seq).delete()
            AuditAnchor.objects.filter(chain=chain, seq=seq, kind=AuditAnchor.Kind.HEAD).delete()
            deleted += n
    return deleted


def _sealed_events(chain: int, batch: int = 2000) -> Iterator[AuditEvent]:
    """The sealed events of ``chain`` in sequence order, ``batch`` rows per query.

    Keyset pages (``chain_seq > last``), not a server-side cursor: memory stays bounded, and
    each page is one statement, so it works behind a transaction pooler (a ``WITH HOLD``
    cursor lives on one server connection, and the pooler may send the next FETCH elsewhere).
    """
    last = None
    while True:
        page = AuditEvent.objects.filter(chain=chain, chain_seq__isnull=False)
        if last is not None:
            page = page.filter(chain_seq__gt=last)
        rows = list(page.order_by("chain_seq")[:batch])
        yield from rows
        if len(rows) < batch:
            return
        last = rows[-1].chain_seq
