"""Retried task creations return the first attempt's task (issue 28, item 7).

Clients that retried after a timeout left two tasks for one call. A retry is recognised by the
same session and JSON-RPC id (2025-11-25) or by ``_meta["io.mcptasks/idempotencyKey"]``, scoped
to the tenant and principal; a unique constraint makes concurrent duplicates create one task.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mcptasks.tasks.idempotency import META_KEY
from tests.support.client import McpClient
from tests.support.servers import Proc, Stack


@pytest.fixture(scope="module")
def tokens(stack: Stack, server: Proc) -> dict[str, str]:
    """Two principals of one tenant, and one of another tenant."""
    return {
        "alice": stack.token("idem", "alice"),
        "bob": stack.token("idem", "bob"),
        "eve": stack.token("idem-other", "alice"),
    }


@pytest.fixture
def connect(server: Proc, tokens: dict[str, str]) -> Iterator[Any]:
    """Initialized clients by principal name, closed after the test."""
    opened: list[McpClient] = []

    def make(who: str) -> McpClient:
        c = McpClient(server.url, token=tokens[who])
        c.initialize()
        opened.append(c)
        return c

    yield make
    for c in opened:
        c.close()


def _count(stack: Stack, marker: int) -> int:
    import psycopg

    with psycopg.connect(stack.env["DATABASE_URL"], autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM mcptasks_task WHERE tool_name = 'test_tick' AND params->'arguments'->>'n' = %s",
            (str(marker),),
        ).fetchone()
        assert row is not None
        return int(row[0])


def _marker() -> int:
    return secrets.randbelow(10**12)


def _create(c: McpClient, n: int, *, rid: Any = None, key: str | None = None) -> Any:
    params: dict[str, Any] = {"name": "test_tick", "arguments": {"n": n}, "task": {}}
    if key is not None:
        params["_meta"] = {META_KEY: key}
    return c.request("tools/call", params, rid=rid)


def test_a_retry_with_the_same_session_and_request_id_returns_the_first_task(stack: Stack, connect: Any) -> None:
    c = connect("alice")
    n = _marker()
    first = _create(c, n, rid="create-1").result["task"]
    again = _create(c, n, rid="create-1").result["task"]
    assert again["taskId"] == first["taskId"]
    assert _count(stack, n) == 1
    # Another id in the same session is another creation.
    other = _create(c, n, rid="create-2").result["task"]
    assert other["taskId"] != first["taskId"] and _count(stack, n) == 2


def test_an_idempotency_key_spans_sessions_and_is_scoped_to_the_principal(stack: Stack, connect: Any) -> None:
    n, key = _marker(), "order-" + secrets.token_hex(8)
    alice1, alice2, bob, eve = connect("alice"), connect("alice"), connect("bob"), connect("eve")
    first = _create(alice1, n, key=key).result["task"]
    # A retry from a new session (the client reconnected), with a new request id.
    assert _create(alice2, n, key=key).result["task"]["taskId"] == first["taskId"]
    # Another principal of the tenant, and a principal of another tenant: independent.
    bobs = _create(bob, n, key=key).result["task"]["taskId"]
    eves = _create(eve, n, key=key).result["task"]["taskId"]
    assert len({first["taskId"], bobs, eves}) == 3
    assert _count(stack, n) == 3
    # The key reused for other arguments is refused, not answered with an unrelated task.
    refused = _create(alice1, n + 1, key=key)
    assert refused.error["code"] == -32602
    assert _count(stack, n + 1) == 0
    # A malformed key is a clear error.
    bad = alice1.request("tools/call", {"name": "test_tick", "arguments": {"n": n}, "task": {},
                                        "_meta": {META_KEY: ["not", "a", "string"]}})
    assert bad.error["code"] == -32602 and META_KEY in bad.error["message"]
    assert _create(alice1, n, key="x" * 256).error["code"] == -32602


def test_concurrent_duplicates_create_one_task(stack: Stack, connect: Any) -> None:
    n, key = _marker(), "burst-" + secrets.token_hex(8)
    clients = [connect("alice") for _ in range(8)]
    ids: list[str] = []
    errors: list[str] = []
    start = threading.Barrier(len(clients))

    def send(c: McpClient) -> None:
        try:
            start.wait(10)
            ids.append(_create(c, n, key=key).result["task"]["taskId"])
        except Exception as exc:  # reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=send, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(ids) == len(clients) and len(set(ids)) == 1
    assert _count(stack, n) == 1
