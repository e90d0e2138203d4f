"""Issue 27: on PostgreSQL a worker's claim is one statement, and concurrent claims never share a row."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from mcptasks.models import Claimed, Task
from tests.support.factories import make_auth, make_session, task_row
from tests.support.plans import generic_rows_read
from tests.support.row_locks import transaction_held

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="the single statement is PostgreSQL's")

CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")


def _claim(worker_id: str, limit: int, **kw: Any) -> Claimed:
    now = timezone.now()
    return Task.objects.claim(worker_id=worker_id, limit=limit, now=now,
                              lease_until=now + dt.timedelta(seconds=30), **kw)


def _session_rows(capabilities: dict[str, Any], n: int) -> tuple[Any, list[Task]]:
    """``n`` claimable rows of a new principal's session whose client declared ``capabilities``."""
    auth = make_auth()
    session = make_session(auth)
    session.client_capabilities = capabilities
    session.save()
    rows = [task_row("plain", auth=auth) for _ in range(n)]
    Task.objects.filter(pk__in=[r.pk for r in rows]).update(session_id=session.pk)
    return auth, rows


def _statements(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if not q["sql"].upper().startswith(CONTROL)]


@pytest.mark.django_db
def test_the_claim_is_one_statement_with_what_the_tool_context_needs() -> None:
    auth, rows = _session_rows({"elicitation": {}}, 3)
    with CaptureQueriesContext(connection) as ctx:
        claimed = _claim("w1", 2, limited={"other_tool": 1})
    assert len(_statements(ctx)) == 1, _statements(ctx)
    assert [t.task_id for t in claimed] == [r.task_id for r in rows[:2]]
    for t in claimed:
        assert (t.attempt, t.worker_id) == (1, "w1")
        assert t.lease_expires_at is not None and t.started_at is not None
        assert t.client_caps == {"elicitation": {}}
        assert (t.tenant_slug, t.principal_ident) == (auth.tenant_slug, auth.principal_name)
        assert t.params == {"name": "plain", "arguments": {}}  # JSON decoded as the ORM does
    stored = Task.objects.get(pk=claimed[0].pk)
    assert (stored.attempt, stored.worker_id, stored.lease_expires_at) == (1, "w1", claimed[0].lease_expires_at)
    # Nothing claimable: still one statement, nothing claimed.
    with CaptureQueriesContext(connection) as ctx:
        assert _claim("w2", 5, exclude=[rows[2].task_id]) == []
    assert len(_statements(ctx)) == 1


@pytest.mark.django_db
def test_a_waiting_limited_tool_takes_the_counted_path() -> None:
    auth = make_auth()
    task_row("plain", auth=auth)
    for _ in range(3):
        task_row("one_at_a_time", auth=auth)
    with CaptureQueriesContext(connection) as ctx:
        claimed = _claim("w1", 10, limited={"one_at_a_time": 1})
    assert sorted(t.tool_name for t in claimed) == ["one_at_a_time", "plain"]
    assert len(_statements(ctx)) > 1  # the probe, the advisory lock and count, then rank, lock, update
    assert _claim("w2", 10, limited={"one_at_a_time": 1}) == []


@pytest.mark.django_db
def test_fair_order_and_caps_in_the_statement() -> None:
    busy, idle = make_auth(), make_auth()
    for _ in range(5):
        task_row("plain", auth=busy)
    for _ in range(2):
        task_row("plain", auth=idle)
    # busy already runs 2 here, cap 3: busy gets one more, after idle's two (its turns are 3, 4...).
    claimed = _claim("w1", 10, tenant_running={busy.tenant_id: 2}, tenant_cap=3)
    assert [t.tenant_id for t in claimed] == [idle.tenant_id, idle.tenant_id, busy.tenant_id]
    # A tenant at its cap is not even ranked.
    assert _claim("w2", 10, tenant_running={busy.tenant_id: 3}, tenant_cap=3) == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_get_the_same_row() -> None:
    auths = [make_auth() for _ in range(3)]
    ids = {task_row("plain", auth=auths[i % 3]).task_id for i in range(60)}
    got: dict[str, list[str]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def claimer(name: str) -> None:
        try:
            start.wait()
            mine = got.setdefault(name, [])
            while batch := _claim(name, 3):
                mine.extend(t.task_id for t in batch)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    every = [tid for mine in got.values() for tid in mine]
    assert len(every) == len(set(every)) == len(ids)  # each row claimed exactly once
    assert set(every) == ids
    assert set(Task.objects.values_list("attempt", flat=True)) == {1}


@pytest.mark.django_db(transaction=True)
def test_the_claim_statement_runs_in_autocommit_without_a_transaction(settings: Any) -> None:
    """Issue 27: no transaction sits open while the worker builds the claimed rows (it showed as
    "idle in transaction" holding the rows' locks); behind a pooler, where the timeouts are set
    per transaction, the claim keeps its transaction."""
    auth = make_auth()
    rows = [task_row("plain", auth=auth) for _ in range(2)]
    seen: list[tuple[str, bool, bool]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((sql.split()[0].upper(), connection.in_atomic_block, connection.get_autocommit()))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        assert len(_claim("w1", 1)) == 1
    assert seen == [("WITH", False, True)]
    seen.clear()
    settings.MCPTASKS = {**settings.MCPTASKS, "DB_POOLER": "transaction"}
    with connection.execute_wrapper(record):
        assert [t.task_id for t in _claim("w2", 1)] == [rows[1].task_id]
    assert [s for s in seen if s[0] == "WITH"] == [("WITH", True, False)]


@pytest.mark.django_db
def test_the_prepared_claim_returns_the_same_rows(settings: Any) -> None:
    """Without a pooler the statement is prepared on the server (``mcptasks.db.prepared``): its
    rows come back typed as through Django's cursor (JSON decoded, aware times)."""
    settings.MCPTASKS = {**settings.MCPTASKS, "DB_POOLER": "none"}
    auth, rows = _session_rows({"sampling": {}}, 2)
    claimed = _claim("w1", 1) + _claim("w1", 1)
    assert [t.task_id for t in claimed] == [r.task_id for r in rows]
    for t in claimed:
        assert t.params == {"name": "plain", "arguments": {}} and t.client_caps == {"sampling": {}}
        assert t.lease_expires_at is not None and t.lease_expires_at.tzinfo is not None
        assert (t.tenant_slug, t.principal_ident) == (auth.tenant_slug, auth.principal_name)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%picked AS MATERIALIZED%"])
        assert cur.fetchone()[0] >= 1


@pytest.mark.django_db
def test_the_statement_and_the_orm_agree_on_what_is_claimable() -> None:
    """``claimsql.claimable_sql`` is ``TaskQuerySet.claimable`` written out: the same rows over
    every combination of status, cancel flag, lease, attempts and ``run_after``, and the same
    exclusions."""
    import itertools

    from mcptasks.models.claimsql import claimable_sql

    now = timezone.now()
    past, future = now - dt.timedelta(seconds=5), now + dt.timedelta(seconds=5)
    auth, other = make_auth(), make_auth()
    rows = []
    for status, cancelled, lease, (attempt, most), run_after in itertools.product(
        ("working", "input_required", "completed"), (False, True), (None, past, future),
        ((0, 1), (1, 1), (1, 3)), (None, past, future),
    ):
        rows.append(task_row("plain", auth=auth, max_attempts=most, status=status, cancel_requested=cancelled,
                             lease_expires_at=lease, attempt=attempt, run_after=run_after))
    rows.append(task_row("plain", auth=other))
    skip = [rows[0].task_id]

    def by_sql(lease: str = "any", **params: Any) -> set[int]:
        with connection.cursor() as cur:
            cur.execute(f"SELECT t.seq FROM mcptasks_task t WHERE {claimable_sql('t', lease=lease)}",  # noqa: S608
                        {"now": now, "skip": [], "capped": [], **params})
            return {r[0] for r in cur.fetchall()}

    orm = Task.objects.claimable(now=now)
    expected = set(orm.values_list("pk", flat=True))
    assert 0 < len(expected) < len(rows)
    assert by_sql() == expected
    # The statement's two halves (never leased, lease lapsed) split the same rows.
    unleased, lapsed = by_sql("unleased"), by_sql("lapsed")
    assert unleased | lapsed == expected and not unleased & lapsed and unleased and lapsed
    assert by_sql(skip=skip) == set(orm.exclude(task_id__in=skip).values_list("pk", flat=True))
    assert by_sql(capped=[other.tenant_id]) == set(orm.exclude(tenant_id=other.tenant_id).values_list("pk", flat=True))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("counted", [False, True])
def test_a_claim_says_whether_it_passed_over_rows(counted: bool) -> None:
    """Issue 27: rows locked by a concurrent claimer are skipped; the claim says it saw them, so
    the worker looks again instead of taking a short claim for an empty queue."""
    auth = make_auth()
    rows = [task_row("plain", auth=auth) for _ in range(3)]
    limited = {"one_at_a_time": 1} if counted else None
    if counted:  # a waiting task of a limited tool sends the claim down the counted path
        rows.append(task_row("one_at_a_time", auth=auth))
    # Another claimer's transaction, holding the two oldest rows.
    with transaction_held(lambda: list(Task.objects.select_for_update().filter(pk__in=[r.pk for r in rows[:2]]))):
        first = _claim("w1", 10, limited=limited)
        assert [t.task_id for t in first] == [r.task_id for r in rows[2:]]
        assert first.passed_over
    second = _claim("w1", 10, limited=limited)
    assert [t.task_id for t in second] == [r.task_id for r in rows[:2]]
    assert not second.passed_over
    third = _claim("w1", 10, limited=limited)
    assert list(third) == [] and not third.passed_over
    # Rows beyond the limit are passed over too: the worker asked for fewer than wait.
    more = [task_row("plain", auth=auth) for _ in range(3)]
    partial = _claim("w2", 2)
    assert [t.task_id for t in partial] == [r.task_id for r in more[:2]] and partial.passed_over


def _backlog(auth: Any, n: int, status: str = "working") -> None:
    """``n`` rows of ``auth``'s principal (claimable unless ``status`` says otherwise), in a few statements."""
    now = timezone.now()
    Task.objects.bulk_create([
        Task(tenant_id=auth.tenant_id, principal_id=auth.principal_id, session_id="s", tool_name="plain",
             params={"name": "plain", "arguments": {}}, created_at=now, last_updated_at=now, max_attempts=1,
             ttl_ms=60_000, status=status) for _ in range(n)], batch_size=2000)


def _claim_params(**kw: Any) -> dict[str, Any]:
    now = timezone.now()
    return {"held_tenants": [], "held_runs": [], "limited": [], "now": now, "skip": [], "capped": [], "ranked": 32,
            "cap": None, "limit": 8, "worker": "w", "lease_until": now + dt.timedelta(seconds=30), "after": 0,
            "tenants": 64, **kw}


@pytest.mark.django_db
def test_a_claim_reads_the_first_rows_of_each_busy_tenant_not_the_whole_backlog() -> None:
    """Issue 27: the claim ranked every waiting row (11 ms a claim behind 5,000 rows of one
    tenant, PostgreSQL's largest cost under a creation load); now each busy tenant's first rows."""
    from mcptasks.models import claimsql

    flood, other = make_auth(), make_auth()
    _backlog(flood, 3000)
    _backlog(other, 2)
    with connection.cursor() as cur:
        cur.execute("ANALYZE mcptasks_task")
    read = generic_rows_read(claimsql._build(Task, probe=False), _claim_params(), table="mcptasks_task")
    assert read < 300, read
    # Fair all the same: the other tenant's two rows come with the flood's first two.
    claimed = _claim("w1", 4)
    assert sorted(t.tenant_id for t in claimed) == sorted([flood.tenant_id] * 2 + [other.tenant_id] * 2)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("seen", "since"), [(0, 3000), (2000, 2000)])
def test_a_claim_planned_on_old_statistics_still_reads_only_the_first_rows(seen: int, since: int) -> None:
    """Issue 27: the claim's generic plan is made from the statistics of its first execution.
    Made when the table held mostly finished tasks and a backlog of ``seen`` rows (vacuumed and
    analyzed), then run behind ``seen + since`` rows, it read every waiting row: through the
    status index to lock the ranked rows (50 ms a claim), through another index and a sort to
    rank one tenant's rows (4,000 rows), and once more in the probe for waiting tools with a
    concurrency limit. Now it reads what it ranks."""
    from mcptasks.models import claimsql

    flood, other = make_auth(), make_auth()
    _backlog(flood, 5000, status="completed")
    _backlog(flood, seen)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE mcptasks_task")
    _backlog(flood, since)
    _backlog(other, 2)
    for probe in (False, True):
        params = _claim_params(limited=["one_at_a_time"] if probe else [])
        read = generic_rows_read(claimsql._build(Task, probe=probe), params, table="mcptasks_task")
        assert read < 300, (probe, read)


@pytest.mark.django_db
def test_a_limited_tool_past_the_ranked_rows_leaves_the_claim_one_statement() -> None:
    """Only the rows a claim ranks decide whether it counts a limited tool's slots: a waiting
    row of such a tool behind the backlog no longer sends every claim down the counted path."""
    auth = make_auth()
    rows = [task_row("plain", auth=auth) for _ in range(12)]
    task_row("one_at_a_time", auth=auth)
    with CaptureQueriesContext(connection) as ctx:
        claimed = _claim("w1", 2, limited={"one_at_a_time": 1})  # ranks 2 x RANKED_PER_SLOT rows
    assert [t.task_id for t in claimed] == [r.task_id for r in rows[:2]]
    assert len(_statements(ctx)) == 1, _statements(ctx)


@pytest.mark.django_db
def test_more_busy_tenants_than_a_claim_ranks_are_served_round_the_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim ranks at most ``TENANTS_PER_CLAIM`` busy tenants (each costs an index descent); the
    next starts after the last it ranked, so every tenant is reached, a flood's backlog included."""
    from mcptasks.models import claimsql

    monkeypatch.setattr(claimsql, "TENANTS_PER_CLAIM", 2)
    monkeypatch.setattr(claimsql, "RANKED_PER_SLOT", 1)
    monkeypatch.setattr(claimsql._ring, "after", 0)
    flood = make_auth()
    _backlog(flood, 40)
    singles = [make_auth() for _ in range(6)]
    for auth in singles:
        _backlog(auth, 1)
    running: dict[int, int] = {}
    for _ in range(7):
        claimed = _claim("w", 1, tenant_running=dict(running))
        assert len(claimed) == 1
        # Ranking two of seven busy tenants: the worker is told to look again soon.
        assert claimed.passed_over
        running[claimed[0].tenant_id] = running.get(claimed[0].tenant_id, 0) + 1
    # One run each: the flood's backlog held up none of the six.
    assert running == {flood.tenant_id: 1, **{a.tenant_id: 1 for a in singles}}
    # Once the singles are served, only the flood is busy: the whole ring fits, the claim starts over.
    claimed = _claim("w", 1, tenant_running=running)
    assert [t.tenant_id for t in claimed] == [flood.tenant_id] and claimsql._ring.after == 0
