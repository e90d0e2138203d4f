"""The wake-up ledger (:class:`mcptasks.db.wakeups.WakeLedger`): a creation committed without a
notification is settled by a statement that reads the workers' flags after it committed, and
only a check statement of its own pays when none is sent at once.

Rows are as the creating statements return them: the created task's key first (None if the
statement did not create it), :func:`mcptasks.db.wakeups.notify_sql`'s value last (1 notified,
0 no worker waits). The database side of the scheme is in tests/mcptasks/test_wakeups.py.
"""

from __future__ import annotations

import asyncio

import pytest

from mcptasks.db import wakeups
from mcptasks.db.write_pool import WriteQueueTimeout


class FakeChecks:
    """Stands in for the check statement (``check`` of :meth:`WakeLedger.done`): answers ``flag``."""

    def __init__(self, flag: int = 0) -> None:
        self.flag, self.sent, self.fail = flag, 0, False

    async def __call__(self) -> tuple[int]:
        self.sent += 1
        await asyncio.sleep(0)
        if self.fail:
            raise WriteQueueTimeout("no connection")
        return (self.flag,)


@pytest.fixture
def checks() -> FakeChecks:
    return FakeChecks()


async def _settle() -> None:
    """Let the loop run the ledger's scheduled check to its end."""
    await asyncio.sleep(wakeups.CHECK_AFTER_S * 2)
    for _ in range(10):
        await asyncio.sleep(0)


async def test_a_commit_nobody_was_woken_for_is_checked_once_after_it(checks: FakeChecks) -> None:
    book = wakeups.WakeLedger()
    book.done(book.sent(), [(1, 0)], check=checks)
    assert book.owed()
    await _settle()
    assert checks.sent == 1 and book.checks == 1
    assert not book.owed() and not book.checking


async def test_a_notifying_statement_settles_its_own_commit(checks: FakeChecks) -> None:
    book = wakeups.WakeLedger()
    book.done(book.sent(), [(1, 1), (2, 1)], check=checks)
    await _settle()
    assert checks.sent == 0 and not book.owed()


async def test_statements_sent_after_each_commit_settle_them_with_one_check_at_the_end(checks: FakeChecks) -> None:
    """Under load each batch is sent in the turn its predecessor ended (tenants.infra.coalesce):
    its read of the flags settles the predecessor's commit, and only the last batch needs a check."""
    book = wakeups.WakeLedger()
    ticket = book.sent()
    for pk in range(1, 6):
        book.done(ticket, [(pk, 0)], check=checks)
        if pk < 5:
            ticket = book.sent()  # the next batch, in the same turn
        await _settle()
    assert checks.sent == 1
    assert not book.owed()


async def test_a_creation_soon_after_a_commit_settles_it_without_a_check(checks: FakeChecks) -> None:
    """One client creating one task after another: the next creation, sent within
    CHECK_AFTER_S, reads the flags after the last commit, so checks are sent only when the
    creations pause."""
    book = wakeups.WakeLedger()
    for pk in range(1, 4):
        book.done(book.sent(), [(pk, 0)], check=checks)
        await asyncio.sleep(wakeups.CHECK_AFTER_S / 5)
    assert checks.sent == 0
    await _settle()
    assert checks.sent == 1 and not book.owed()


async def test_a_statement_sent_before_the_commit_does_not_settle_it(checks: FakeChecks) -> None:
    """Its read of the flags may predate the commit: the worker may have asked after that read
    and claimed before the commit. A check is sent although a statement is in flight."""
    book = wakeups.WakeLedger()
    first, earlier = book.sent(), book.sent()
    book.done(first, [(1, 0)], check=checks)
    await _settle()
    assert checks.sent == 1
    book.done(earlier, [None], check=checks)  # it created nothing: no new debt, and it settles nothing
    await _settle()
    assert checks.sent == 1 and not book.owed()


async def test_a_statement_that_did_not_read_the_flags_settles_nothing(checks: FakeChecks) -> None:
    """A batch whose creations were all refused returned no row, so no read of the flags is known."""
    book = wakeups.WakeLedger()
    book.done(book.sent(), [(1, 0)], check=checks)
    ticket = book.sent()
    book.done(ticket, [None, None], check=checks)
    assert book.owed()
    await _settle()
    assert checks.sent == 1 and not book.owed()


async def test_an_answer_lost_after_sending_is_a_debt(checks: FakeChecks) -> None:
    """A statement whose connection failed may have committed without notifying."""
    book = wakeups.WakeLedger()
    book.done(book.sent(), [], may_have_committed=True, check=checks)
    await _settle()
    assert checks.sent == 1 and not book.owed()


async def test_a_failed_check_leaves_the_debt_to_the_next_statement(checks: FakeChecks,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    book = wakeups.WakeLedger()
    checks.fail = True
    book.done(book.sent(), [(1, 0)], check=checks)
    await _settle()
    assert checks.sent == 1 and book.owed() and not book.checking
    assert "wake-up check failed (WriteQueueTimeout)" in caplog.text
    checks.fail = False
    book.done(book.sent(), [None], check=checks)  # the next statement ends: the debt is checked again
    await _settle()
    assert checks.sent == 2 and not book.owed()


def test_each_event_loop_has_its_own_ledger() -> None:
    async def two() -> tuple[wakeups.WakeLedger, wakeups.WakeLedger]:
        return wakeups.ledger(), wakeups.ledger()

    first, again = asyncio.run(two())
    other, _ = asyncio.run(two())
    assert first is again and other is not first
