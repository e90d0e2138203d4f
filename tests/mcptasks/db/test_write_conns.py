"""Grouped single-statement writes (:func:`mcptasks.db.write_conns.execute_grouped`).

Concurrent statements of one group share a pipelined transaction (one send, one commit); groups
never share one; a statement the database refuses rolls its batch back and every statement is
run again alone, so each caller gets its own answer and nothing is written twice.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import OperationalError, connection

from mcptasks.db import async_sql, write_conns
from mcptasks.models import Task
from mcptasks.tasks import creation
from tenants.selectors import clear_limits_cache, effective_limits
from tests.support.async_db import run_closing
from tests.support.factories import demo_tool, make_auth, make_session
from tests.support.requirements import require_postgres
from tests.support.row_locks import counter_rows_held, transaction_held

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PROBE = "mcptasks_grouped_probe"


@pytest.fixture(autouse=True)
def _postgres(settings: Any) -> Iterator[None]:
    require_postgres()
    async_sql._failed_until = 0.0
    settings.TENANTS = {**settings.TENANTS, "TASK_MAX_CONCURRENT": 0}
    clear_limits_cache()
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {PROBE} (v integer NOT NULL)")
        cur.execute(f"TRUNCATE {PROBE}")
    yield
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {PROBE}")


def _xmins(tenant_id: int) -> list[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT xmin::text FROM mcptasks_task WHERE tenant_id = %s", [tenant_id])
        return [row[0] for row in cur.fetchall()]


def _create_many(auths: list[Any], per_auth: int) -> list[Task]:
    sessions = [make_session(auth) for auth in auths]
    for auth in auths:
        effective_limits(tenant_id=auth.tenant_id)

    async def race() -> list[Task]:
        return list(await asyncio.gather(*(
            creation.acreate_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1},
                                  request_id=f"{auth.tenant_id}-{i}", progress_token=None)
            for i in range(per_auth) for auth, session in zip(auths, sessions, strict=True))))

    return run_closing(race)  # type: ignore[no-any-return]


def test_creations_of_uncounted_tenants_share_transactions_across_tenants() -> None:
    """Their statements lock nothing: grouped by tenant, 20 tenants made 0.58x the creations of one."""
    one, other = make_auth(), make_auth()
    tasks = _create_many([one, other], 24)
    assert len({t.task_id for t in tasks}) == 48
    xmins_one, xmins_other = _xmins(one.tenant_id), _xmins(other.tenant_id)
    assert len(xmins_one) == len(xmins_other) == 24
    # Fewer commits than creations (24 each before grouping), and batches that mix the tenants.
    assert len(set(xmins_one) | set(xmins_other)) < 24
    assert set(xmins_one) & set(xmins_other)


def test_a_counted_tenant_shares_transactions_with_no_other_tenant() -> None:
    """A counted tenant's creation locks its row (its slot): batched with others, a row held
    elsewhere would hold up their creations too, and two such batches could lock in a cycle."""
    from tenants.models import Tenant

    counted = [make_auth(Tenant.objects.create(slug=f"grouped-counted-{i}", max_concurrent_tasks=100))
               for i in range(2)]
    uncounted = make_auth()
    tasks = _create_many([*counted, uncounted], 16)
    assert len({t.task_id for t in tasks}) == 48
    xmins = [set(_xmins(auth.tenant_id)) for auth in (*counted, uncounted)]
    assert all(len(x) < 16 for x in xmins)  # each still batches its own creations
    assert not xmins[0] & xmins[1] and not xmins[0] & xmins[2] and not xmins[1] & xmins[2]
    assert Tenant.objects.get(pk=counted[0].tenant_id).active_tasks == 16  # every slot taken once


def test_a_limit_set_after_the_limits_were_read_still_counts_every_slot_in_a_shared_batch() -> None:
    """The web process still believes the tenant uncounted, so its creations join the shared
    group; the statement reads the limit itself and takes (or refuses) each slot exactly."""
    from tenants.models import Tenant

    limited, free = make_auth(), make_auth()
    for auth in (limited, free):
        effective_limits(tenant_id=auth.tenant_id)  # cached as uncounted
    Tenant.objects.filter(pk=limited.tenant_id).update(max_concurrent_tasks=10)
    sessions = [make_session(auth) for auth in (limited, free)]

    async def race() -> list[Any]:
        return list(await asyncio.gather(*(
            creation.acreate_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1},
                                  request_id=f"{auth.tenant_id}-{i}", progress_token=None)
            for i in range(16) for auth, session in zip((limited, free), sessions, strict=True)),
            return_exceptions=True))

    outcomes = run_closing(race)
    assert len(_xmins(free.tenant_id)) == 16  # the other tenant is not held up
    created = len(_xmins(limited.tenant_id))
    assert created == 10 and Tenant.objects.get(pk=limited.tenant_id).active_tasks == 10
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(refused) == 6, refused


def test_a_retried_key_in_a_shared_batch_rolls_back_no_other_tenants_creations() -> None:
    """A unique conflict would roll the whole shared transaction back and every creation in it
    would be run again alone: a client retrying one key could undo every other tenant's batching."""
    retrier, other = make_auth(), make_auth()
    sessions = [make_session(auth) for auth in (retrier, other)]
    for auth in (retrier, other):
        effective_limits(tenant_id=auth.tenant_id)

    def create(auth: Any, session: Any, i: int, key: str | None) -> Any:
        return creation.acreate_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1},
                                     request_id=f"{auth.tenant_id}-{i}", progress_token=None, idempotency_key=key)

    first = run_closing(lambda: create(retrier, sessions[0], 0, "retried-key"))

    async def race() -> list[Any]:
        return list(await asyncio.gather(
            create(other, sessions[1], 0, None), create(retrier, sessions[0], 0, "retried-key"),
            *(create(other, sessions[1], i, None) for i in range(1, 20))))

    outcomes = run_closing(race)
    assert outcomes[1].task_id == first.task_id  # the retry gets the first attempt's task
    assert len(_xmins(retrier.tenant_id)) == 1
    xmins = _xmins(other.tenant_id)
    assert len(xmins) == 20 and len(set(xmins)) < 5, xmins  # still batched, not re-run one by one


def test_a_shared_batch_is_one_statement_with_every_audit_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """Uncounted creations batched together are one multi-row statement, not a pipeline of one
    statement each; every task gets its own audit event, in the order the tasks were made."""
    from mcptasks.models import AuditEvent

    sizes: list[int] = []
    real = write_conns._run_batch

    async def counted(sql: str, items: Any, many: Any = None, wakes: bool = False) -> Any:
        if many is not None and len(items) > 1:
            sizes.append(len(items))
        return await real(sql, items, many, wakes)

    monkeypatch.setattr(write_conns, "_run_batch", counted)
    one, other = make_auth(), make_auth()
    tasks = _create_many([one, other], 16)
    assert len({t.task_id for t in tasks}) == 32
    assert sizes and max(sizes) > 1 and sum(sizes) >= 16, sizes
    stored = {t.task_id: t.pk for t in Task.objects.filter(tenant_id__in=[one.tenant_id, other.tenant_id])}
    assert {t.task_id: t.pk for t in tasks} == stored
    events = list(AuditEvent.objects.filter(action="task.create", task_id__in=list(stored)).order_by("pk"))
    assert sorted(e.task_id for e in events) == sorted(stored)
    assert [stored[e.task_id] for e in events] == sorted(stored.values())  # the tasks' order
    for e in events:
        task = next(t for t in tasks if t.task_id == e.task_id)
        assert (e.tenant_id, e.principal_id, e.chain) == (task.tenant_id, task.principal_id, task.tenant_id)


def test_one_key_twice_in_one_batch_makes_one_task() -> None:
    """Two creations with the same idempotency key in one shared statement: the second row is
    left out (ON CONFLICT DO NOTHING holds within a statement too) and answered with the first."""
    from mcptasks.models import AuditEvent

    auth = make_auth()
    session = make_session(auth)
    effective_limits(tenant_id=auth.tenant_id)

    async def race() -> list[Task]:
        return list(await asyncio.gather(*(
            creation.acreate_task(auth=auth, session=session, tool=demo_tool(), arguments={"ms": 1},
                                  request_id=i, progress_token=None, idempotency_key="twice" if i < 2 else None)
            for i in range(8))))

    tasks = run_closing(race)
    assert tasks[0].task_id == tasks[1].task_id
    assert Task.objects.filter(tenant_id=auth.tenant_id).count() == 7
    assert AuditEvent.objects.filter(task_id=tasks[0].task_id, action="task.create").count() == 1


def test_a_tenant_row_held_for_update_holds_up_no_other_tenants_creations() -> None:
    """Uncounted tenants' creations share one statement per batch, and a task's foreign keys wait
    for a row held FOR UPDATE: a host lost inside such a transaction made another tenant's
    creation wait with it, then fail (503) at the lock timeout. The held tenant's creations now
    leave the batch at once and wait alone, on the ORM path."""
    held, free = make_auth(), make_auth()
    sessions = {auth.tenant_id: make_session(auth) for auth in (held, free)}
    for auth in (held, free):
        effective_limits(tenant_id=auth.tenant_id)
    done_while_held: list[bool] = []

    async def create(auth: Any, i: int, released: threading.Event) -> Task:
        task = await creation.acreate_task(auth=auth, session=sessions[auth.tenant_id], tool=demo_tool(),
                                           arguments={"ms": 1}, request_id=i, progress_token=None)
        if auth is free:
            done_while_held.append(not released.is_set())
        return task

    with counter_rows_held(tenant_id=held.tenant_id, principal_id=held.principal_id, for_update=True,
                           hold_s=3.0) as released:
        async def race() -> list[Any]:
            return list(await asyncio.gather(*(create(held, i, released) for i in range(4)),
                                             *(create(free, i, released) for i in range(16)),
                                             return_exceptions=True))

        outcomes = run_closing(race)
    assert all(isinstance(o, Task) for o in outcomes), outcomes  # the held tenant's once released
    assert done_while_held == [True] * 16
    assert len(_xmins(free.tenant_id)) == 16 and len(_xmins(held.tenant_id)) == 4


def test_a_row_waiting_on_another_transactions_key_fails_only_its_own_creation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client retries an idempotency key while its first attempt's transaction is still open
    (on a host that vanished, say): that row of the shared statement waits, and at the lock
    timeout the whole statement is rolled back. Every other tenant's creation in it used to fail
    with it (503); now each is made again alone and only the retry waits and fails."""
    from django.db.models import F

    retrier, other = make_auth(), make_auth()
    sessions = {auth.tenant_id: make_session(auth) for auth in (retrier, other)}
    for auth in (retrier, other):
        effective_limits(tenant_id=auth.tenant_id)
    real = async_sql.conninfo
    monkeypatch.setattr(async_sql, "conninfo", lambda: {**real(), "options": "-c lock_timeout=300"})

    def create(auth: Any, i: int, key: str | None) -> Any:
        return creation.acreate_task(auth=auth, session=sessions[auth.tenant_id], tool=demo_tool(),
                                     arguments={"ms": 1}, request_id=i, progress_token=None, idempotency_key=key)

    first = run_closing(lambda: create(retrier, 0, "held-key"))

    async def race() -> list[Any]:
        # The first creation goes alone; the rest, the retry among them, share the next statement.
        return list(await asyncio.gather(*(create(other, i, None) for i in range(8)),
                                         create(retrier, 1, "held-key"),
                                         *(create(other, i, None) for i in range(8, 16)), return_exceptions=True))

    # The first attempt's row, changed by a transaction that stays open.
    with transaction_held(lambda: Task.objects.filter(pk=first.pk).update(status=F("status"))):
        outcomes = run_closing(race)
    retried = outcomes.pop(8)
    assert all(isinstance(o, Task) for o in outcomes), outcomes
    assert len(_xmins(other.tenant_id)) == 16
    assert isinstance(retried, OperationalError) or retried.task_id == first.task_id, retried
    assert Task.objects.filter(tenant_id=retrier.tenant_id).count() == 1


def _probe_rows() -> list[int]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT v FROM {PROBE} ORDER BY v")
        return [row[0] for row in cur.fetchall()]


def test_a_refused_statement_answers_its_own_caller_and_the_rest_are_written_once() -> None:
    sql = f"INSERT INTO {PROBE} (v) VALUES ($1) RETURNING 60 / $1"  # noqa: S608 (a constant)

    async def race() -> list[Any]:
        return list(await asyncio.gather(*(write_conns.execute_grouped(sql, [v], group=1) for v in (1, 2, 0, 3, 5, 6)),
                                         return_exceptions=True))

    outcomes = run_closing(race)
    assert outcomes[:2] == [(60,), (30,)] and outcomes[3:] == [(20,), (12,), (10,)]
    assert isinstance(outcomes[2], write_conns.Refused)
    assert _probe_rows() == [1, 2, 3, 5, 6]  # the refused one rolled back, none written twice


def test_a_lock_timeout_fails_the_whole_batch_and_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A limited tenant's row held elsewhere past the lock timeout: every creation of the batch
    gets the retryable error, and none was written."""
    from tenants.models import Tenant

    tenant = Tenant.objects.create(slug="grouped-locked", max_concurrent_tasks=100)
    auth = make_auth(tenant)
    real = async_sql.conninfo
    monkeypatch.setattr(async_sql, "conninfo", lambda: {**real(), "options": "-c lock_timeout=300"})
    sql = (f"WITH locked AS (UPDATE tenants_tenant SET active_tasks = active_tasks WHERE id = $1 RETURNING id) "  # noqa: S608
           f"INSERT INTO {PROBE} (v) SELECT id FROM locked RETURNING v")

    async def race() -> list[Any]:
        return list(await asyncio.gather(*(write_conns.execute_grouped(sql, [tenant.pk], group=tenant.pk)
                                           for _ in range(8)), return_exceptions=True))

    with counter_rows_held(tenant_id=tenant.pk, principal_id=auth.principal_id):
        outcomes = run_closing(race)
    assert all(isinstance(o, OperationalError) for o in outcomes), outcomes
    assert _probe_rows() == []


def test_an_event_loop_that_ends_while_its_pool_connects_still_ends() -> None:
    """psycopg_pool's worker swallowed the cancellation of a connection attempt and waited for
    its next job forever: a loop shut down while its pool connected (a SIGTERM during a database
    reconnection, a test's loop) never finished (a CI run hung in a test's teardown for 300 s)."""

    async def main() -> None:
        pool = await write_conns._pool()
        while not pool.get_stats().get("connections_num"):
            await asyncio.sleep(0)  # until the first connection attempt is under way

    ended = threading.Event()

    def run() -> None:
        asyncio.run(main())
        ended.set()

    threading.Thread(target=run, daemon=True).start()
    assert ended.wait(15), "the event loop never finished shutting down"
