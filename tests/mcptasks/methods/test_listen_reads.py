"""A listen's reads: the ``tasks/get`` rendering without a thread hop, and wake-ups batched per read."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import OperationalError

from mcptasks.db import async_sql as fastreads
from mcptasks.endpoint.listen_feed import ListenFeed
from mcptasks.endpoint.stream_session import StreamSession
from mcptasks.methods.listen import Listen
from mcptasks.models import Task, TaskStatus
from mcptasks.streams import events
from mcptasks.tasks import era2026 as era_tasks
from mcptasks.tasks import era2026_view as handlers
from mcptasks.tasks import messages, selectors, transitions
from tests.support.factories import expire, make_auth, make_task
from tests.support.requirements import require_postgres

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgres() -> None:
    require_postgres()
    fastreads._failed_until = 0.0


def _no_orm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every ORM read a listen could fall back to fail: only the async path may answer."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the listen read went through the ORM")

    monkeypatch.setattr(selectors, "_task_queryset", refuse)
    monkeypatch.setattr(handlers, "pending_requests", refuse)


def _changes(listen: Listen, task_ids: list[str] | None = None) -> list[dict[str, Any]]:
    import json

    async def run() -> list[bytes]:
        try:
            return await listen.changes(task_ids)
        finally:
            await fastreads.close()

    frames = async_to_sync(run)()
    return [json.loads(f.decode().split("data: ", 1)[1]) for f in frames]


def test_notifications_are_tasks_get_for_that_caller_read_without_the_orm(monkeypatch: pytest.MonkeyPatch) -> None:
    owner = make_auth()
    from tenants.models import Tenant

    reader = make_auth(tenant=Tenant.objects.get(pk=owner.tenant_id), scopes="mcp:tools mcp:tasks mcp:tasks:tenant")
    asking, done, plain, gone = (make_task(owner) for _ in range(4))
    messages.add_task_message(task=asking, method="elicitation/create",
                              params={"message": "Delete?", "requestedSchema": {"type": "object"}})
    assert Task.objects.get(pk=asking.pk).status == TaskStatus.INPUT_REQUIRED
    assert transitions.transition(task=done, to=TaskStatus.COMPLETED,
                                  result={"content": [{"type": "text", "text": "ok"}]})
    expire(gone)
    ids = [asking.task_id, done.task_id, plain.task_id, gone.task_id]
    # What tasks/get answers each caller, through the sync ORM path.
    expected = {
        who: {t.task_id: handlers.task_as_seen_by(Task.objects.get(pk=t.pk), principal_id=who.principal_id)
              for t in (asking, done, plain)}
        for who in (owner, reader)
    }
    assert "inputRequests" in expected[owner][asking.task_id]
    assert "inputRequests" not in expected[reader][asking.task_id]  # owner-only
    _no_orm(monkeypatch)
    for who in (owner, reader):
        got = {n["params"]["taskId"]: n["params"] for n in _changes(Listen(
            auth=who, request_id=7, agreed={"taskIds": ids}, task_ids=ids))}
        assert set(got) == {asking.task_id, done.task_id, plain.task_id}  # the expired one is left out
        for task_id, params in got.items():
            assert params.pop("_meta") == {"io.modelcontextprotocol/subscriptionId": 7}
            view = {k: v for k, v in expected[who][task_id].items() if k != "resultType"}
            assert params == view


def test_a_foreign_task_is_never_read_into_a_listen() -> None:
    owner, stranger = make_auth(), make_auth()
    theirs = make_task(stranger)
    assert _changes(Listen(auth=owner, request_id=1, agreed={}, task_ids=[theirs.task_id])) == []


def test_an_unchanged_task_is_not_sent_twice() -> None:
    owner = make_auth()
    task = make_task(owner)
    listen = Listen(auth=owner, request_id=1, agreed={}, task_ids=[task.task_id])
    assert len(_changes(listen)) == 1
    assert _changes(listen) == []
    transitions.set_status_message(task=task, message="halfway")
    (again,) = _changes(listen)
    assert again["params"]["statusMessage"] == "halfway"


class _Recorder:
    """Stands in for a listen: records which task ids each read asked for, each read slow."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.reads: list[list[str] | None] = []
        self.fail = fail
        self.release = asyncio.Event()

    async def changes(self, task_ids: list[str] | None = None) -> list[bytes]:
        self.reads.append(sorted(task_ids) if task_ids is not None else None)
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [f"frame {len(self.reads)}".encode()]


class _Wire:
    """Stands in for the HTTP response: records what the stream writes."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send_headers(self, *, status: int = 200, headers: Any = None) -> None:
        pass

    async def send_body(self, body: bytes, *, more_body: bool = False) -> None:
        self.sent.append(body)


def _consumer(listen: _Recorder) -> tuple[ListenFeed, list[bytes]]:
    # The listen a consumer's stream serves (what the consumer dispatches to).
    wire = _Wire()
    stream = StreamSession(wire, None, cors_headers=[])
    consumer = ListenFeed(stream, listen)  # type: ignore[arg-type]
    stream.follower = consumer
    return consumer, wire.sent


async def _signal(consumer: ListenFeed, message: dict[str, Any]) -> None:
    # The handler must return without waiting for the read (bounded: a regression fails, not hangs).
    await asyncio.wait_for(consumer.stream.handle(message), timeout=5)


def test_signals_arriving_during_a_read_share_the_next_read() -> None:
    async def scenario() -> tuple[list[list[str] | None], list[bytes]]:
        listen = _Recorder()
        consumer, sent = _consumer(listen)
        # What the consumer's dispatch does for each task.signal: returns at once.
        await _signal(consumer, {"type": "task.signal", "task_id": "a"})
        await asyncio.sleep(0)
        for task_id in ("b", "c", "b"):
            await _signal(consumer, {"type": "task.signal", "task_id": task_id})
        listen.release.set()
        assert consumer._reader is not None
        await consumer._reader
        # A re-check (no task id) reads every watched task.
        await _signal(consumer, {"type": "task.signal", "event": "recheck"})
        await consumer._reader
        return listen.reads, sent

    reads, sent = async_to_sync(scenario)()
    assert reads == [["a"], ["b", "c"], None]
    assert sent == [b"frame 1", b"frame 2", b"frame 3"]


def test_a_failed_read_fails_in_the_consumers_dispatch() -> None:
    async def scenario() -> BaseException | None:
        listen = _Recorder(fail=OperationalError("database away"))
        consumer, _sent = _consumer(listen)
        await _signal(consumer, {"type": "task.signal", "task_id": "a"})
        listen.release.set()
        assert consumer._reader is not None
        await consumer._reader
        message = consumer.stream.local.get_nowait()
        assert message == {"type": "listen.failed"}
        try:
            await consumer.stream.handle(message)
        except OperationalError as exc:
            return exc
        return None

    error = async_to_sync(scenario)()
    assert isinstance(error, OperationalError)


def test_a_2026_tasks_change_goes_straight_to_its_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2026-07-28 task's session is one request's row that no client holds: a status change
    stores no 2025 notification there (a transaction and a channel-layer send that would come
    before the listen's wake-up), while a 2025-11-25 session's task still gets its own."""
    from mcptasks.models import StreamEvent
    from mcptasks.protocol.era2026 import RequestMeta
    from mcptasks.streams import signals as stream_signals
    from tests.support.factories import make_session

    signals: list[str] = []
    monkeypatch.setattr(stream_signals, "signal_task", lambda task_id, event, **_: signals.append(task_id))
    owner = make_auth()
    request_row = era_tasks.open_request_session(auth=owner, meta=RequestMeta.model_validate(
        {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}))
    new_era = make_task(owner, request_row)
    old_era = make_task(owner, make_session(owner))
    events.open_get_stream(session_id=old_era.session_id)  # its client opened the GET stream
    before = StreamEvent.objects.count()
    assert transitions.set_status_message(task=new_era, message="a")
    assert StreamEvent.objects.count() == before
    assert transitions.set_status_message(task=old_era, message="b")
    assert StreamEvent.objects.filter(session_id=old_era.session_id).count() == 1
    assert StreamEvent.objects.count() == before + 1
    assert signals == [new_era.task_id, old_era.task_id]
    # A 2025-11-25 tasks/result stream waiting on the 2026 task still gets its notifications.
    Task.objects.filter(pk=new_era.pk).update(stream_id="r-bound")
    assert transitions.set_status_message(task=new_era, message="c")
    assert StreamEvent.objects.filter(stream_id="r-bound").count() == 1
