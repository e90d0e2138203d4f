"""``subscriptions/listen`` with ``notifications/tasks`` (MCP 2026-07-28, tasks extension), across processes.

Two web processes and a worker share PostgreSQL and a private Redis that a test stops: a task
created through one web process and run by the worker is pushed to a listener on the other.
Every server message is validated against the 2026-07-28 schema copy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.client2026 import TASKS_EXTENSION, Client2026, ListenStream
from tests.support.redis_proc import PrivateRedis
from tests.support.requirements import require_multiprocess
from tests.support.schema2026 import validate_2026
from tests.support.servers import DEFAULT_DELIVERY, Proc, Stack

TASKS = {"elicitation": {}, "extensions": {TASKS_EXTENSION: {}}}
ACK = "notifications/subscriptions/acknowledged"
TERMINAL = {"completed", "failed", "cancelled"}


@dataclass
class Deployment:
    a: Proc
    b: Proc
    redis: PrivateRedis
    stack: Stack
    env: dict[str, str]


@pytest.fixture(scope="module")
def deployment(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    if not stack.multi_process:
        require_multiprocess()
    redis = PrivateRedis(Path(tmp_path_factory.mktemp("listen-redis")))
    redis.start()
    env = {**DEFAULT_DELIVERY, "REDIS_URL": redis.url, "MCPTASKS_TASK_RESULT_RECHECK_S": "30"}
    procs = [stack.daphne(embedded_worker=False, extra_env=env), stack.daphne(embedded_worker=False, extra_env=env)]
    procs.append(stack.worker(concurrency=8, extra_env=env))
    try:
        yield Deployment(procs[0], procs[1], redis, stack, env)
    finally:
        for p in procs:
            p.terminate(timeout=15)
        redis.thaw()
        redis.stop()


_tokens: dict[tuple[str, str, str], str] = {}


def _client(dep: Deployment, proc: Proc, tenant: str, principal: str, scopes: str = "mcp:tools mcp:tasks",
            capabilities: dict[str, Any] | None = None) -> Client2026:
    key = (tenant, principal, scopes)
    if key not in _tokens:  # each token costs two management commands
        _tokens[key] = dep.stack.token(tenant, principal, scopes)
    return Client2026(proc.url, capabilities=TASKS if capabilities is None else capabilities, token=_tokens[key])


def _valid(stream: ListenStream) -> None:
    """Every message of a listen: the acknowledgement first, then task notifications, then maybe the result."""
    assert stream.messages and stream.messages[0]["method"] == ACK, stream.messages[:2]
    for message in stream.messages:
        if "method" not in message:
            validate_2026("SubscriptionsListenResultResponse", message)
            continue
        validate_2026("JSONRPCNotification", message)
        assert message["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == stream.request_id
        if message["method"] == ACK:
            validate_2026("SubscriptionsAcknowledgedNotification", message)
        else:
            # Never progress or log messages: only task states.
            assert message["method"] == "notifications/tasks", message


def _as_get(params: dict[str, Any]) -> dict[str, Any]:
    """A notification's task as tasks/get answers it (the same rendering, plus resultType)."""
    return {"resultType": "complete", **{k: v for k, v in params.items() if k != "_meta"}}


def test_a_worker_run_is_pushed_to_a_listener_on_another_web_process(deployment: Deployment) -> None:
    alice_a = _client(deployment, deployment.a, "lst", "alice")
    alice_b = _client(deployment, deployment.b, "lst", "alice")
    with alice_a, alice_b:
        task_id = alice_a.result("tools/call", {"name": "demo_progress",
                                                "arguments": {"steps": 5, "interval_ms": 300}})["taskId"]
        stream = ListenStream(alice_b, {"taskIds": [task_id], "toolsListChanged": True})
        try:
            assert stream.status == 200
            assert stream.wait(lambda s: any(p["status"] in TERMINAL for p in s.task_states(task_id)))
            ack = stream.messages[0]
            # Only what the server agreed to: this server emits no list-changed notifications.
            assert ack["params"]["notifications"] == {"taskIds": [task_id]}
            states = stream.task_states(task_id)
            assert states[0]["status"] == "working"  # the current state, right after the ack
            assert states[-1]["status"] == "completed"
            assert _as_get(states[-1]) == alice_a.result("tasks/get", {"taskId": task_id})
            assert states[-1]["result"]["content"][0]["text"] == "Completed 5 steps"
            _valid(stream)
        finally:
            stream.close()


def test_input_requests_are_pushed_to_the_owner_only(deployment: Deployment) -> None:
    alice = _client(deployment, deployment.a, "lst", "alice")
    auditor = _client(deployment, deployment.b, "lst", "auditor", "mcp:tools mcp:tasks mcp:tasks:tenant")
    with alice, auditor:
        task_id = alice.result("tools/call", {"name": "confirm_delete", "arguments": {"filename": "f"}})["taskId"]
        own = ListenStream(alice, {"taskIds": [task_id]})
        watcher = ListenStream(auditor, {"taskIds": [task_id]})
        try:
            for stream in (own, watcher):
                assert stream.wait(lambda s: any(p["status"] == "input_required" for p in s.task_states(task_id)))
                assert stream.messages[0]["params"]["notifications"] == {"taskIds": [task_id]}
            owner_view = [p for p in own.task_states(task_id) if p["status"] == "input_required"][-1]
            (key, request), = owner_view["inputRequests"].items()
            assert request["method"] == "elicitation/create"
            assert _as_get(owner_view) == alice.result("tasks/get", {"taskId": task_id})
            reader_view = [p for p in watcher.task_states(task_id) if p["status"] == "input_required"][-1]
            assert "inputRequests" not in reader_view
            assert _as_get(reader_view) == auditor.result("tasks/get", {"taskId": task_id})
            alice.result("tasks/update", {"taskId": task_id, "inputResponses": {
                key: {"action": "accept", "content": {"confirm": True}}}})
            for stream in (own, watcher):
                assert stream.wait(lambda s: any(p["status"] == "completed" for p in s.task_states(task_id)))
                _valid(stream)
        finally:
            own.close()
            watcher.close()


def test_listening_again_after_a_drop_sees_the_terminal_state(deployment: Deployment) -> None:
    alice = _client(deployment, deployment.a, "lst", "alice")
    with alice:
        task_id = alice.result("tools/call", {"name": "slow_compute", "arguments": {"seconds": 1.5}})["taskId"]
        first = ListenStream(alice, {"taskIds": [task_id]})
        assert first.wait(lambda s: bool(s.task_states(task_id)))
        first.close()  # the connection drops while the task runs
        assert alice.wait_status(task_id, TERMINAL)["status"] == "completed"
        assert not any(p["status"] in TERMINAL for p in first.task_states(task_id))
        again = ListenStream(_client(deployment, deployment.b, "lst", "alice"), {"taskIds": [task_id]})
        try:
            assert again.wait(lambda s: bool(s.task_states(task_id)))
            (state,) = again.task_states(task_id)
            assert state["status"] == "completed"
            assert _as_get(state) == alice.result("tasks/get", {"taskId": task_id})
            _valid(again)
        finally:
            again.close()


def test_foreign_and_unknown_ids_never_leak(deployment: Deployment) -> None:
    alice = _client(deployment, deployment.a, "lst", "alice")
    mallory = _client(deployment, deployment.b, "lst", "mallory")
    outsider = _client(deployment, deployment.b, "lst-other", "alice")
    with alice, mallory, outsider:
        task_id = alice.result("tools/call", {"name": "slow_compute", "arguments": {"seconds": 1}})["taskId"]
        probes = [ListenStream(other, {"taskIds": [ids]}) for other in (mallory, outsider)
                  for ids in (task_id, "no-such-task-" + "0" * 20)]
        mine = ListenStream(alice, {"taskIds": [task_id, task_id, "x" * 300]})
        try:
            assert mine.wait(lambda s: any(p["status"] == "completed" for p in s.task_states(task_id)))
            assert mine.messages[0]["params"]["notifications"] == {"taskIds": [task_id]}
            time.sleep(1.0)  # the completion had every chance to reach the probes too
            acks = [probe.messages[0]["params"]["notifications"] for probe in probes]
            # A foreign id is acknowledged exactly like a missing one: left out, nothing more.
            assert acks == [{"taskIds": []}] * len(probes)
            for probe in probes:
                assert probe.of("notifications/tasks") == []
                assert task_id not in str(probe.messages)
                _valid(probe)
            # Audited like a tasks/get of them: the probes, and the cross-tenant one in the owner's chain.
            actions = _audited(deployment.stack, task_id)
            assert ("task.lookup_failed", "subscriptions/listen") in actions
            assert ("task.cross_tenant", "subscriptions/listen") in actions
        finally:
            for stream in (*probes, mine):
                stream.close()


def _audited(stack: Stack, task_id: str) -> set[tuple[str, str]]:
    """(action, method) of the audit events naming ``task_id``, read straight from the stack's database."""
    import psycopg

    with psycopg.connect(stack.env["DATABASE_URL"]) as conn:
        rows = conn.execute("SELECT action, data->>'method' FROM mcptasks_auditevent "
                            "WHERE task_id = %s OR data->>'taskId' = %s", (task_id, task_id)).fetchall()
    return {(action, method) for action, method in rows}


def test_task_ids_without_the_extension_is_32021(deployment: Deployment) -> None:
    alice = _client(deployment, deployment.a, "lst", "alice", capabilities={})
    with alice:
        stream = ListenStream(alice, {"taskIds": ["anything"]})
        stream.ended.wait(10)
        assert stream.status == 400
        (error,) = stream.messages
        validate_2026("JSONRPCErrorResponse", error)
        assert error["id"] == stream.request_id and error["error"]["code"] == -32021
        assert error["error"]["data"]["requiredCapabilities"] == {"extensions": {TASKS_EXTENSION: {}}}


def test_watching_tasks_needs_the_tasks_scope_and_a_bounded_list(deployment: Deployment) -> None:
    tools_only = _client(deployment, deployment.a, "lst", "alice", "mcp:tools")
    alice = _client(deployment, deployment.a, "lst", "alice")
    with tools_only, alice:
        refused = ListenStream(tools_only, {"taskIds": ["anything"]})
        refused.ended.wait(10)
        assert refused.status == 403 and refused.messages[0]["id"] == refused.request_id
        too_many = ListenStream(alice, {"taskIds": [f"t{i}" for i in range(101)]})
        too_many.ended.wait(10)
        (error,) = too_many.messages
        validate_2026("JSONRPCErrorResponse", error)
        assert error["error"]["code"] == -32602


def test_a_listen_during_a_redis_outage_still_delivers(deployment: Deployment) -> None:
    alice_a = _client(deployment, deployment.a, "lst", "alice")
    alice_b = _client(deployment, deployment.b, "lst", "alice")
    with alice_a, alice_b:
        deployment.redis.stop()
        try:
            task_id = alice_a.result("tools/call", {"name": "slow_compute", "arguments": {"seconds": 1}})["taskId"]
            stream = ListenStream(alice_b, {"taskIds": [task_id]})
            try:
                assert stream.wait(lambda s: any(p["status"] == "completed" for p in s.task_states(task_id)),
                                   timeout=40), stream.messages
                _valid(stream)
            finally:
                stream.close()
        finally:
            deployment.redis.start()


def test_open_listens_are_capped_per_principal_and_shutdown_ends_them_with_a_result(
    deployment: Deployment,
) -> None:
    web = deployment.stack.daphne(embedded_worker=False,
                                  extra_env={**deployment.env, "MCPTASKS_MAX_STREAMS_PER_PRINCIPAL": "1"})
    try:
        alice = _client(deployment, web, "lst", "alice")
        bob = _client(deployment, web, "lst", "bob")
        with alice, bob:
            task_id = alice.result("tools/call", {"name": "slow_compute", "arguments": {"seconds": 60}})["taskId"]
            first = ListenStream(alice, {"taskIds": [task_id]})
            assert first.wait(lambda s: bool(s.task_states(task_id)))
            refused = ListenStream(alice, {"taskIds": [task_id]})
            refused.ended.wait(10)
            assert refused.status == 429 and refused.messages[0]["id"] == refused.request_id
            validate_2026("JSONRPCErrorResponse", refused.messages[0])
            other = ListenStream(bob, {})  # another principal has its own slots
            assert other.status == 200 and other.wait(lambda s: bool(s.of(ACK)))
            assert other.messages[0]["params"]["notifications"] == {}
            web.terminate(timeout=20)
            for stream in (first, other):
                assert stream.ended.wait(10)
                final = stream.messages[-1]
                assert final["id"] == stream.request_id and final["result"]["resultType"] == "complete"
                assert final["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == stream.request_id
                _valid(stream)
            alice_a = _client(deployment, deployment.a, "lst", "alice")
            with alice_a:
                alice_a.result("tasks/cancel", {"taskId": task_id})
    finally:
        web.terminate(timeout=10)
