"""Request-path writes run side by side on PostgreSQL (mcptasks.db.write_pool)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from mcptasks.db import async_sql as fastreads
from mcptasks.db import write_pool as dbwrites
from mcptasks.methods import era2025 as handlers
from mcptasks.models import Task
from mcptasks.protocol.messages import CallToolParams
from mcptasks.tasks import creation
from tests.support.factories import make_auth, make_session
from tests.support.requirements import require_postgres

pytestmark = pytest.mark.django_db(transaction=True)


def _ctx(auth: Any, session: Any, request_id: int = 1) -> handlers.RequestContext:
    async def no_stream(prefix: str) -> str:
        raise AssertionError("no stream expected")

    return handlers.RequestContext(auth=auth, session=session, protocol_version="2025-11-25", request_id=request_id,
                                   open_stream=no_stream)


def test_task_creations_overlap_on_their_own_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three creations at once all reach the database at the same time (a barrier that only
    opens when all three wait in it); on the one shared thread they would queue and it would
    never open."""
    require_postgres()
    auth = make_auth()
    session = make_session(auth)
    barrier = threading.Barrier(3, timeout=10)
    seen: list[str] = []
    real = creation.create_task

    def meeting(**kw: Any) -> Task:
        seen.append(threading.current_thread().name)
        barrier.wait()
        return real(**kw)

    monkeypatch.setattr(creation, "create_task", meeting)
    params = CallToolParams.model_validate({"name": "demo_sleep", "arguments": {"ms": 1}, "task": {"ttl": 60000}})

    async def create_three() -> list[Any]:
        try:
            # Three requests (three ids: one id twice in a session is a retry of one creation).
            return await asyncio.gather(*(handlers.tools_call(_ctx(auth, session, n), params) for n in range(3)))
        finally:
            await fastreads.close()

    results = async_to_sync(create_three)()
    assert len({r["task"]["taskId"] for r in results}) == 3
    assert len(set(seen)) == 3 and all(name.startswith("mcptasks-write") for name in seen)
    assert Task.objects.filter(session_id=session.pk).count() == 3


def test_without_write_threads_writes_share_the_database_thread(settings: Any) -> None:
    require_postgres()
    settings.MCPTASKS = {**settings.MCPTASKS, "WRITE_THREADS": 0}
    names: list[str] = []

    def where() -> str:
        names.append(threading.current_thread().name)
        return "ok"

    assert async_to_sync(dbwrites.run)(where) == "ok"
    assert not names[0].startswith("mcptasks-write")
