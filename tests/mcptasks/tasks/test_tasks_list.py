"""tasks/list (selectors.list_tasks): keyset pagination, opaque signed cursors, stable under inserts."""

from __future__ import annotations

import threading
import types
from collections.abc import Callable

import pytest
from django.db import connection

from mcptasks.models import Task
from mcptasks.protocol.errors import McpError
from mcptasks.tasks import selectors
from tenants.auth import AuthContext
from tests.support.factories import expire, make_auth, make_session, make_task, make_tenant
from tests.support.requirements import require_postgres
from tests.support.waiting import wait_for

PRE_EXISTING = 150
CONCURRENT = 1000
WRITERS = 4
PAGE = 7


def _page_all(auth: AuthContext, *, between_pages: Callable[[], object] | None = None) -> list[str]:
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = selectors.list_tasks(auth=auth, cursor=cursor, page_size=PAGE)
        assert len(page.tasks) <= PAGE
        seen += [t.task_id for t in page.tasks]
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor
        if between_pages is not None:
            between_pages()


@pytest.mark.django_db(transaction=True)
def test_every_preexisting_task_listed_exactly_once_while_1000_are_created_concurrently() -> None:
    require_postgres()
    # More live tasks than the default concurrency quota: the tenant's own limit allows them.
    auth = make_auth(make_tenant(max_concurrent_tasks=PRE_EXISTING + CONCURRENT))
    session = make_session(auth)
    before = [make_task(auth, session).task_id for _ in range(PRE_EXISTING)]
    started = threading.Event()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            started.wait(10)
            for _ in range(n):
                make_task(auth, session)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(CONCURRENT // WRITERS,)) for _ in range(WRITERS)]
    for th in threads:
        th.start()
    started.set()

    def count() -> int:
        return Task.objects.filter(principal_id=auth.principal_id).count()

    def a_write_since(last: int) -> bool:
        return count() > last or not any(th.is_alive() for th in threads)

    def wait_for_a_write() -> None:
        # Interleave: a task is created between any two pages (until the writers are done).
        last = count()
        wait_for("a task created by the writers", lambda: a_write_since(last), timeout=60, every=0.005)

    # Page while the writers run; note how many tasks existed when we started and ended.
    wait_for("the writers' first task", lambda: a_write_since(PRE_EXISTING), timeout=60, every=0.005)
    count_at_start = count()
    seen = _page_all(auth, between_pages=wait_for_a_write)
    count_at_end = count()
    for th in threads:
        th.join(300)
    assert not errors, errors
    assert count_at_end > count_at_start, "pagination did not overlap the concurrent creation"
    assert len(seen) == len(set(seen)), "a task was listed twice"
    missing = set(before) - set(seen)
    assert not missing, f"{len(missing)} pre-existing tasks were skipped"
    assert Task.objects.filter(principal_id=auth.principal_id).count() == PRE_EXISTING + CONCURRENT
    # Afterwards a full listing has every task exactly once.
    final = _page_all(auth)
    assert len(final) == len(set(final)) == PRE_EXISTING + CONCURRENT


@pytest.mark.django_db
def test_pages_have_next_cursor_exactly_when_more_tasks_exist() -> None:
    auth = make_auth()
    session = make_session(auth)
    ids = [make_task(auth, session).task_id for _ in range(2 * PAGE)]
    first = selectors.list_tasks(auth=auth, cursor=None, page_size=PAGE)
    assert len(first.tasks) == PAGE and first.next_cursor
    second = selectors.list_tasks(auth=auth, cursor=first.next_cursor, page_size=PAGE)
    assert len(second.tasks) == PAGE
    assert second.next_cursor is None
    assert sorted(t.task_id for t in first.tasks + second.tasks) == sorted(ids)


@pytest.mark.django_db
def test_list_excludes_expired_and_other_principals_tasks() -> None:
    auth = make_auth()
    other = make_auth(tenant=None)
    mine = make_task(auth)
    gone = make_task(auth)
    expire(gone)
    make_task(other)
    listed = [t.task_id for t in selectors.list_tasks(auth=auth, cursor=None, page_size=PAGE).tasks]
    assert listed == [mine.task_id]


@pytest.mark.django_db
@pytest.mark.parametrize("cursor", ["", "garbage", "eyJzIjoxLCJwIjoxfQ:1abc:xyz"])
def test_bad_cursor_is_refused_with_32602(cursor: str) -> None:
    auth = make_auth()
    with pytest.raises(McpError) as exc:
        selectors.list_tasks(auth=auth, cursor=cursor, page_size=PAGE)
    assert exc.value.code == -32602


@pytest.mark.django_db
def test_tampered_cursor_is_refused_with_32602() -> None:
    auth = make_auth()
    session = make_session(auth)
    for _ in range(PAGE + 1):
        make_task(auth, session)
    cursor = selectors.list_tasks(auth=auth, cursor=None, page_size=PAGE).next_cursor
    assert cursor
    payload, _, signature = cursor.partition(":")
    forged = payload[:-1] + ("A" if payload[-1] != "A" else "B") + ":" + signature
    with pytest.raises(McpError) as exc:
        selectors.list_tasks(auth=auth, cursor=forged, page_size=PAGE)
    assert exc.value.code == -32602


@pytest.mark.django_db
def test_cursor_of_another_principal_is_refused() -> None:
    alice = make_auth()
    bob = make_auth(tenant=None)
    for _ in range(PAGE + 1):
        make_task(alice)
    cursor = selectors.list_tasks(auth=alice, cursor=None, page_size=PAGE).next_cursor
    assert cursor
    with pytest.raises(McpError) as exc:
        selectors.list_tasks(auth=bob, cursor=cursor, page_size=PAGE)
    assert exc.value.code == -32602
    assert exc.value.message == "Invalid cursor"


@pytest.mark.django_db
def test_the_same_page_gets_the_same_cursor_seconds_later(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = make_auth()
    for _ in range(PAGE + 1):
        make_task(auth)
    cursors = []
    for now in (1_800_000_000.0, 1_800_000_100.0):
        monkeypatch.setattr("django.core.signing.time", types.SimpleNamespace(time=lambda now=now: now))
        cursors.append(selectors.list_tasks(auth=auth, cursor=None, page_size=PAGE).next_cursor)
    assert cursors[0] and cursors[0] == cursors[1]


@pytest.mark.django_db
def test_a_cursor_from_before_the_upgrade_continues_the_walk() -> None:
    from django.core import signing

    auth = make_auth()
    for _ in range(PAGE + 1):
        make_task(auth)
    first = selectors.list_tasks(auth=auth, cursor=None, page_size=PAGE)
    assert first.next_cursor
    # The format cursors had before they lost their timestamp (signed with the same key and salt).
    seq = selectors._decode_cursor(first.next_cursor, auth=auth)
    old = signing.dumps({"s": seq, "p": auth.principal_id}, salt=selectors._CURSOR_SALT, compress=False)
    rest = selectors.list_tasks(auth=auth, cursor=old, page_size=PAGE)
    assert len(rest.tasks) == 1 and rest.next_cursor is None
