"""Which processes seal (issue 27): workers seal; a web process beside them is only the backstop."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from mcptasks.audit import housekeeping
from mcptasks.audit import trail as audit
from mcptasks.models import AuditEvent
from mcptasks.processes import embedded
from mcptasks.tasks import auditing
from tests.support.factories import make_auth

pytestmark = pytest.mark.django_db


def _unsealed_events(n: int, *, age_s: float) -> None:
    auth = make_auth()
    for i in range(n):
        auditing.record_audit(auth=auth, action="test.backstop", data={"n": i})
    AuditEvent.objects.filter(action="test.backstop").update(
        created_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=age_s))


def test_the_backstop_leaves_fresh_events_to_the_workers() -> None:
    """Events younger than the backstop's age are not this pass's: nothing is sealed."""
    audit.seal_all()
    _unsealed_events(3, age_s=1)
    assert housekeeping.housekeep(backstop=True) == 0
    assert AuditEvent.objects.filter(action="test.backstop", sealed_at__isnull=True).count() == 3


def test_the_backstop_seals_what_no_worker_sealed(settings: Any) -> None:
    """Once the oldest unsealed event is ``BACKSTOP_INTERVALS`` sealing intervals old (no worker
    is sealing), the web process seals everything pending, and the chain verifies."""
    audit.seal_all()
    interval = 1.0
    settings.MCPTASKS = {**settings.MCPTASKS, "AUDIT_SEAL_INTERVAL_S": interval}
    _unsealed_events(3, age_s=housekeeping.BACKSTOP_INTERVALS * interval + 1)
    assert housekeeping.housekeep(backstop=True) == 3
    assert not AuditEvent.objects.filter(sealed_at__isnull=True).exists()
    assert all(audit.verify(chain=chain).ok for chain in audit.chains())


def test_a_worker_seals_fresh_events() -> None:
    audit.seal_all()
    _unsealed_events(2, age_s=0)
    assert housekeeping.housekeep() == 2


class _IdleWorker:
    """Stands in for the embedded worker: runs until told to stop."""

    def __init__(self, **_kw: Any) -> None:
        self.running: dict[str, Any] = {}

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()


@pytest.mark.parametrize(("embedded_worker", "backstop"), [(False, True), (True, False)])
def test_a_web_process_seals_as_the_backstop_unless_it_runs_the_worker(
    embedded_worker: bool, backstop: bool, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "EMBEDDED_WORKER": embedded_worker, "AUDIT_SEAL_INTERVAL_S": 0.01}
    passes: list[bool] = []

    def housekeep(*, backstop: bool = False) -> int:
        passes.append(backstop)
        return 0

    monkeypatch.setattr(embedded, "housekeep", housekeep)
    monkeypatch.setattr(embedded.cleanup, "cleanup_expired", lambda **_kw: {})
    monkeypatch.setattr("mcptasks.worker.loop.Worker", _IdleWorker)

    async def run() -> None:
        runtime = embedded.EmbeddedRuntime(app=None)
        monkeypatch.setattr(runtime, "_install_shutdown_hook", lambda: None)
        runtime.start()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if passes:
                break
        for task in runtime._tasks:
            task.cancel()
        await asyncio.gather(*runtime._tasks, return_exceptions=True)

    asyncio.run(run())
    assert passes and set(passes) == {backstop}
