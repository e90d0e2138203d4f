"""The audit trail the services write (creation, outcome, retrieval, failed lookups) and its sealed chains."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.utils import timezone

from mcptasks.audit import trail as audit
from mcptasks.methods import era2025 as handlers
from mcptasks.models import AuditAnchor, AuditEvent, McpSession, Task
from mcptasks.protocol.errors import McpError
from mcptasks.protocol.messages import TaskIdParams
from mcptasks.tasks import auditing, transitions
from tenants.auth import AuthContext
from tests.support.factories import make_auth
from tests.support.pages import pages_fetched
from tests.support.requirements import require_postgres

pytestmark = pytest.mark.django_db


def ctx_for(auth: AuthContext, session: McpSession) -> handlers.RequestContext:
    async def no_stream(prefix: str) -> str:
        raise AssertionError("no stream expected")

    return handlers.RequestContext(auth=auth, session=session, protocol_version="2025-11-25", request_id=1,
                                   open_stream=no_stream)


def test_retrieval_and_failed_lookups_are_audited(auth: AuthContext, session: McpSession,
                                                  task_factory: Any) -> None:
    task: Task = task_factory()
    assert transitions.transition(task=task, to="completed", result={"content": []})
    ctx = ctx_for(auth, session)
    async_to_sync(handlers.tasks_result)(ctx, TaskIdParams(taskId=task.task_id))
    with pytest.raises(McpError):
        async_to_sync(handlers.tasks_get)(ctx, TaskIdParams(taskId="no-such-task"))
    actions = list(AuditEvent.objects.filter(tenant_id=auth.tenant_id).values_list("action", flat=True))
    assert "task.result" in actions
    failed = AuditEvent.objects.get(action="task.lookup_failed")
    assert failed.data["taskId"] == "no-such-task" and failed.data["method"] == "tasks/get"
    assert failed.principal_id == auth.principal_id


def _verify(auth: AuthContext, **kw: Any) -> audit.Report:
    return audit.verify(chain=auth.tenant_id, **kw)


def _chain_of_five(auth: AuthContext) -> list[AuditEvent]:
    for n in range(5):
        auditing.record_audit(auth=auth, action="test.event", data={"n": n})
    audit.seal_all()
    return list(AuditEvent.objects.filter(chain=auth.tenant_id).order_by("chain_seq"))


def test_appends_are_unsealed_until_the_sealer_chains_them_with_keyed_hashes(auth: AuthContext) -> None:
    auditing.record_audit(auth=auth, action="test.event", data={"n": 1})
    ev = AuditEvent.objects.get(action="test.event")
    assert ev.hash == "" and ev.chain_seq is None and ev.sealed_at is None
    events = _chain_of_five(auth)
    prev = ""
    for seq, ev in enumerate(events, start=1):
        assert ev.chain_seq == seq and ev.prev_hash == prev and ev.sealed_at is not None
        # Keyed: the hash is an HMAC over the id, time, place, actor, action and data.
        assert ev.hash == audit.event_hash(event_id=ev.pk, created_at=ev.created_at, chain=ev.chain, seq=seq,
                                           principal=ev.principal_ref, action=ev.action, task_id=ev.task_id,
                                           data=ev.data, prev=prev)
        body = json.dumps({"t": ev.tenant_id, "p": ev.principal_id, "a": ev.action, "task": ev.task_id,
                           "d": ev.data, "prev": prev}, sort_keys=True, default=str)
        assert ev.hash != hashlib.sha256(body.encode()).hexdigest()
        prev = ev.hash
    assert _verify(auth).ok and _verify(auth).head_seq == 6


def test_chains_are_per_tenant_and_late_commits_join_the_next_pass(auth: AuthContext) -> None:
    other = make_auth()
    auditing.record_audit(auth=auth, action="a.one")
    auditing.record_audit(auth=other, action="b.one")
    assert audit.seal() == 2
    auditing.record_audit(auth=other, action="b.two")
    auditing.record_audit(auth=auth, action="a.two")
    assert audit.seal() == 2 and audit.seal() == 0
    for who in (auth, other):
        seqs = list(AuditEvent.objects.filter(chain=who.tenant_id).order_by("chain_seq")
                    .values_list("chain_seq", flat=True))
        assert seqs == [1, 2]
        assert _verify(who).ok


def test_verify_detects_an_edited_row(auth: AuthContext) -> None:
    events = _chain_of_five(auth)
    AuditEvent.objects.filter(pk=events[2].pk).update(data={"n": 99})
    report = _verify(auth)
    assert not report.ok and report.first_broken_id == events[2].pk


def test_verify_detects_a_back_dated_row(auth: AuthContext) -> None:
    events = _chain_of_five(auth)
    AuditEvent.objects.filter(pk=events[3].pk).update(created_at=events[3].created_at - dt.timedelta(hours=1))
    report = _verify(auth)
    assert not report.ok and report.first_broken_id == events[3].pk


def test_verify_detects_a_row_deleted_from_the_middle(auth: AuthContext) -> None:
    events = _chain_of_five(auth)
    AuditEvent.objects.filter(pk=events[1].pk).delete()
    report = _verify(auth)
    assert not report.ok and report.first_broken_id == events[2].pk
    assert any("missing" in p for p in report.problems)


def test_verify_detects_the_newest_rows_deleted(auth: AuthContext) -> None:
    events = _chain_of_five(auth)
    AuditEvent.objects.filter(pk__in=[events[-1].pk, events[-2].pk]).delete()
    report = _verify(auth)
    assert not report.ok and any("newest events deleted" in p for p in report.problems)


def test_exported_anchors_detect_truncation_even_with_the_stored_anchors_deleted(auth: AuthContext) -> None:
    events = _chain_of_five(auth)
    exported = audit.export_anchors(chain=auth.tenant_id)
    assert exported[0]["seq"] == len(events)
    AuditEvent.objects.filter(pk=events[-1].pk).delete()
    AuditAnchor.objects.filter(chain=auth.tenant_id).delete()
    assert _verify(auth).ok  # what the database alone still proves ...
    assert not _verify(auth, external_anchors=exported).ok  # ... and what the kept anchor adds


def test_a_chain_recomputed_without_the_key_does_not_verify(auth: AuthContext, settings: Any) -> None:
    events = _chain_of_five(auth)
    settings.AUDIT_KEY = "someone-elses-key"
    AuditEvent.objects.filter(pk=events[0].pk).update(data={"n": "forged"})
    # The forger re-seals every row and re-signs the anchors with the key they have.
    AuditEvent.objects.filter(chain=auth.tenant_id).update(sealed_at=None, hash="", prev_hash="", chain_seq=None)
    AuditAnchor.objects.filter(chain=auth.tenant_id).delete()
    audit.seal_all()
    assert _verify(auth).ok  # consistent under the forger's key
    settings.AUDIT_KEY = ""
    report = _verify(auth)
    assert not report.ok and report.first_broken_id == events[0].pk


def test_prune_keeps_the_rest_verifiable(auth: AuthContext) -> None:
    events = _chain_of_five(auth)
    old = timezone.now() - dt.timedelta(days=40)
    AuditEvent.objects.filter(pk__in=[e.pk for e in events[:3]]).update(created_at=old)
    # Back-dating breaks those rows' hashes; re-seal so the chain is honest about the new times.
    AuditEvent.objects.filter(chain=auth.tenant_id).update(sealed_at=None, hash="", prev_hash="", chain_seq=None)
    AuditAnchor.objects.filter(chain=auth.tenant_id).delete()
    audit.seal_all()
    assert audit.prune(older_than=dt.timedelta(days=30)) == 3
    assert AuditEvent.objects.filter(chain=auth.tenant_id).count() == 2
    assert _verify(auth).ok
    AuditEvent.objects.filter(chain=auth.tenant_id).order_by("chain_seq").first().delete()  # type: ignore[union-attr]
    assert not _verify(auth).ok


def test_verify_command_names_the_first_broken_event(auth: AuthContext) -> None:
    events = _chain_of_five(auth)
    out = io.StringIO()
    call_command("mcptasks_audit", "verify", stdout=out)
    assert "OK" in out.getvalue()
    AuditEvent.objects.filter(pk=events[1].pk).update(action="task.nothing")
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("mcptasks_audit", "verify", stdout=out)
    assert f"first broken event {events[1].pk}" in out.getvalue()


def test_unsealed_events_past_the_grace_are_reported(auth: AuthContext) -> None:
    auditing.record_audit(auth=auth, action="test.event")
    AuditEvent.objects.update(created_at=timezone.now() - dt.timedelta(minutes=5))
    assert _verify(auth).stale_unsealed == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_and_sealers_never_fork_a_chain() -> None:
    """PostgreSQL: writers append without any lock while two sealers race; one chain results."""
    require_postgres()
    auth = make_auth()
    stop = threading.Event()
    sealed: list[int] = []

    def writer(n: int) -> None:
        try:
            for i in range(40):
                with transaction.atomic():
                    auditing.record_audit(auth=auth, action="test.event", data={"w": n, "i": i})
        finally:
            connections.close_all()

    def sealer() -> None:
        try:
            while not stop.is_set():
                sealed.append(audit.seal(limit=7))
        finally:
            connections.close_all()

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    sealers = [threading.Thread(target=sealer) for _ in range(2)]
    for t in writers + sealers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in sealers:
        t.join()
    audit.seal_all()
    assert sum(sealed) > 0
    seqs = list(AuditEvent.objects.filter(chain=auth.tenant_id).values_list("chain_seq", flat=True))
    assert sorted(seqs) == list(range(1, 161))
    assert _verify(auth).ok


def test_a_malformed_anchors_file_is_a_clear_error(auth: AuthContext, tmp_path: Any) -> None:
    _chain_of_five(auth)
    bad = tmp_path / "anchors.jsonl"
    for text in ('{"chain": 1}\n', "not json\n", '{"chain": "x", "seq": 1, "head": "", "kind": "head", "at": "no"}\n'):
        bad.write_text(text)
        with pytest.raises(CommandError, match="cannot read anchors"):
            call_command("mcptasks_audit", "verify", "--anchors", str(bad), stdout=io.StringIO())


@pytest.mark.django_db(transaction=True)
def test_async_appends_share_statements_and_seal_like_the_orms(monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL: appends from async code go over the async connection, several per INSERT,
    and are the same rows the ORM writes (the chain verifies); a failing connection falls back."""
    import asyncio

    from mcptasks.db import async_sql as fastreads

    require_postgres()
    fastreads._failed_until = 0.0
    auth = make_auth()
    auditing.record_audit(auth=auth, action="test.sync", data={"n": -1})
    statements: list[str] = []
    real_read = fastreads._read

    async def counting(sql: str, params: Any, *, all_rows: Any) -> Any:
        statements.append(sql)
        return await real_read(sql, params, all_rows=all_rows)

    monkeypatch.setattr(fastreads, "_read", counting)

    async def append_all() -> None:
        try:
            await asyncio.gather(*(
                audit.aappend(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action="test.async",
                              task_id=f"t{n}", data={"n": n, "nested": [n, {"x": "é"}]})
                for n in range(12)
            ))
        finally:
            await fastreads.close()

    async_to_sync(append_all)()
    assert 1 <= len([s for s in statements if s.startswith("INSERT")]) < 12
    rows = list(AuditEvent.objects.filter(action="test.async").order_by("task_id"))
    assert sorted(r.data["n"] for r in rows) == list(range(12))
    sync_row = AuditEvent.objects.get(action="test.sync")
    for row in rows:
        assert (row.tenant_id, row.principal_id, row.chain, row.principal_ref) == (
            sync_row.tenant_id, sync_row.principal_id, sync_row.chain, sync_row.principal_ref)
        assert row.data["nested"][1] == {"x": "é"} and row.hash == "" and row.sealed_at is None
    audit.seal_all()
    assert _verify(auth).ok and _verify(auth).head_seq == 13

    async def broken(*args: Any, **kw: Any) -> Any:
        raise fastreads.Unavailable

    monkeypatch.setattr(fastreads, "insert", broken)
    async_to_sync(audit.aappend)(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action="test.fallback")
    assert AuditEvent.objects.filter(action="test.fallback").count() == 1


def test_a_sealing_pass_writes_its_seals_in_one_statement_on_postgresql(auth: AuthContext) -> None:
    """Three events per task reach the sealer: on PostgreSQL their seals are one UPDATE, not one each."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    require_postgres()
    for n in range(12):
        auditing.record_audit(auth=auth, action="test.many", data={"n": n})
    with CaptureQueriesContext(connection) as ctx:
        assert audit.seal() == 12
    updates = [q["sql"] for q in ctx.captured_queries if 'UPDATE "mcptasks_auditevent"' in q["sql"]]
    assert len(updates) == 1, updates
    sealed = list(AuditEvent.objects.filter(action="test.many").order_by("chain_seq"))
    assert [e.chain_seq for e in sealed] == list(range(1, 13))
    assert all(e.sealed_at is not None and len(e.hash) == 64 for e in sealed)
    assert _verify(auth).ok


def test_a_sealing_pass_finds_a_chains_head_without_reading_its_history(auth: AuthContext) -> None:
    """PostgreSQL: with 3,000 sealed events in a tenant's chain, finding its head reads a few
    pages of the audit table and its indexes, not the chain (a MAX grouped by chain read every
    sealed event on every pass: a pass grew with the tenant's whole history)."""
    require_postgres()
    audit.append_many(audit.event(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action="test.history",
                                  data={"n": n}) for n in range(3000))
    assert audit.seal_all() == 3000
    newest = AuditEvent.objects.get(chain=auth.tenant_id, chain_seq=3000)
    with transaction.atomic():
        before = pages_fetched(AuditEvent)
        heads = audit._heads({auth.tenant_id})
        fetched = pages_fetched(AuditEvent) - before
    assert heads == {auth.tenant_id: (3000, newest.hash)}
    assert fetched < 30, f"finding the head of a chain of 3,000 events asked for {fetched} pages"


def test_writing_and_sealing_an_event_maintains_few_indexes_and_checks_no_keys(auth: AuthContext) -> None:
    """PostgreSQL: a task writes three events and seals each (an update no index lets be HOT),
    so every index of the table costs six index writes a task. The table keeps one index per
    query that needs it (eight: ``db_index=True`` on two text columns made four, with one more
    the tenant-time index already covers), and its keys are not checked by the database."""
    require_postgres()
    table = AuditEvent._meta.db_table
    with connections["default"].cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass", [table])
        indexes = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'f'", [table])
        foreign_keys = cur.fetchone()[0]
    assert (indexes, foreign_keys) == (8, 0)
    audit.append_many(audit.event(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action="flag.test",
                                  task_id=f"t{n}") for n in range(3))
    assert audit.seal() >= 3
    # What the queries need still answers: the dashboard's flags (a prefix), an auditor's task.
    assert AuditEvent.objects.filter(action__startswith="flag.", task_id="t1").count() == 1


def test_deleting_a_principal_still_clears_its_events_key_and_keeps_the_chain(auth: AuthContext) -> None:
    """The keys are unchecked by the database, but Django's SET_NULL still runs: no event
    points at a deleted principal, and what was sealed still verifies."""
    from tenants.models import Principal

    audit.append_many([audit.event(tenant_id=auth.tenant_id, principal_id=auth.principal_id, action="test.gone")])
    audit.seal_all()
    Principal.objects.filter(pk=auth.principal_id).delete()
    event = AuditEvent.objects.get(action="test.gone")
    assert (event.principal_id, event.principal_ref) == (None, auth.principal_id)
    assert _verify(auth).ok


def _unsealed(action: str, n: int) -> tuple[AuthContext, Any]:
    """PostgreSQL: a new tenant with ``n`` unsealed events, and the hash function before any patch."""
    require_postgres()
    auth = make_auth()
    for i in range(n):
        auditing.record_audit(auth=auth, action=action, data={"n": i})
    return auth, audit.event_hash


@pytest.mark.django_db(transaction=True)
def test_a_sealing_pass_holds_no_transaction_open_while_it_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27: every process's sealing pass hashed its events inside the transaction that held
    the sealer's lock, so PostgreSQL saw it ``idle in transaction`` while Python worked. Now
    the events are read and hashed first, and the write is one statement."""
    from django.db import connection

    auth, hash_event = _unsealed("test.hash", 5)
    open_while_hashing: list[bool] = []

    def watching(**kw: Any) -> str:
        open_while_hashing.append(connection.in_atomic_block)
        return hash_event(**kw)

    monkeypatch.setattr(audit, "event_hash", watching)
    assert audit.seal() == 5
    assert open_while_hashing == [False] * 5
    assert _verify(auth).ok


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pooler", ["none", "transaction"])
def test_a_pass_that_another_process_overtakes_writes_nothing(pooler: str, settings: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process's pass starts while this one hashes. Without a pooler it skips at once
    (this pass holds the sealer's lock for its session). Behind a transaction pooler it seals
    the same events first; this pass's write then finds the chain moved and writes nothing.
    Either way the chain stays one chain."""
    settings.MCPTASKS = {**settings.MCPTASKS, "DB_POOLER": pooler}
    auth, hash_event = _unsealed("test.race", 4)
    raced: list[int] = []

    def racing(**kw: Any) -> str:
        if not raced:  # the first hash of this pass: another process's pass runs to its end
            monkeypatch.setattr(audit, "event_hash", hash_event)
            result: list[int] = []
            thread = threading.Thread(target=lambda: (result.append(audit.seal()), connections.close_all()))
            thread.start()
            thread.join()
            raced.extend(result)
            monkeypatch.setattr(audit, "event_hash", racing)
        return hash_event(**kw)

    monkeypatch.setattr(audit, "event_hash", racing)
    ours = audit.seal()
    assert (ours, raced) == ((4, [0]) if pooler == "none" else (0, [4]))
    seqs = sorted(AuditEvent.objects.filter(chain=auth.tenant_id).values_list("chain_seq", flat=True))
    assert seqs == [1, 2, 3, 4]
    assert AuditAnchor.objects.filter(chain=auth.tenant_id).count() == 1
    assert _verify(auth).ok
