"""Tenancy through a real daphne: every task is bound to its tenant and principal.

Another tenant's or principal's task answers exactly like a missing one, sessions belong to
the principal that opened them, ``mcp:tasks:tenant`` widens reads to the whole tenant, and
missing scopes get 403 ``insufficient_scope``. The anonymous mode and its system check are
covered at the end.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.support.client import McpClient
from tests.support.servers import Proc, Stack

NOT_FOUND = "Failed to retrieve task: Task not found"


def mint_tokens(stack: Stack, specs: list[tuple[str, str, str]]) -> list[str]:
    """Many built-in-AS tokens from ONE process (each ``stack.token`` call costs two).

    Uses the same functions as ``manage.py mcptasks_tenant create/token``; ``specs`` are
    ``(tenant, principal, space-separated scopes)``.
    """
    code = "from tenants import cli\n" + "".join(
        f"cli.create(slug={t!r}); print(cli.token(slug={t!r}, principal={p!r}, scopes={s.split()!r})[-1])\n"
        for t, p, s in specs
    )
    lines = stack.manage("shell", "-c", code).stdout.strip().splitlines()
    assert len(lines) >= len(specs), lines
    return lines[-len(specs) :]


FULL = "mcp:tools mcp:tasks"


def _client(server: Proc, token: str | None) -> McpClient:
    c = McpClient(server.url, token=token)
    c.initialize()
    return c


def _raw(c: McpClient, method: str, params: dict[str, Any], rid: Any = 77) -> tuple[int, str, bytes]:
    """POST one request and return (status, content-type, body) exactly as sent by the server."""
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    r = c.http.post(c.url, json=body, headers=c.headers())
    return r.status_code, r.headers.get("content-type", ""), r.content


def _shell(stack: Stack, code: str) -> str:
    return stack.manage("shell", "-c", code).stdout.strip()


def test_foreign_tasks_answer_exactly_like_missing_ones(stack: Stack, auth_server: Proc) -> None:
    # bob: same tenant, other principal; eve: other tenant, same principal name.
    tokens = mint_tokens(stack, [("acme", "alice", FULL), ("acme", "bob", FULL), ("evilcorp", "alice", FULL)])
    alice, bob, eve = (_client(auth_server, t) for t in tokens)
    task = alice.call_task("demo_sleep", {"ms": 60_000})
    tid = task["taskId"]
    missing = str(uuid.uuid4())
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        for other in (bob, eve):
            reference = _raw(other, method, {"taskId": missing})
            status, ctype, body = reference
            assert status == 200 and "json" in ctype
            assert httpx.Response(200, content=body).json() == {
                "jsonrpc": "2.0",
                "id": 77,
                "error": {"code": -32602, "message": NOT_FOUND},
            }
            # Same id in both requests: the whole response must be byte-identical.
            assert _raw(other, method, {"taskId": tid}) == reference, (method, other.token)
    # Nothing leaked, nothing changed: the owner still sees a running task.
    assert alice.request("tasks/get", {"taskId": tid}).result["status"] == "working"
    # tasks/list: only the caller's own tasks.
    bob_task = bob.call_task("demo_sleep", {"ms": 60_000})
    eve_task = eve.call_task("demo_sleep", {"ms": 60_000})
    ids = {t["taskId"] for t in alice.request("tasks/list", {}).result["tasks"]}
    assert tid in ids and bob_task["taskId"] not in ids and eve_task["taskId"] not in ids
    assert {t["taskId"] for t in bob.request("tasks/list", {}).result["tasks"]} == {bob_task["taskId"]}
    assert {t["taskId"] for t in eve.request("tasks/list", {}).result["tasks"]} == {eve_task["taskId"]}
    # The binding is stored on the row.
    out = _shell(
        stack,
        "from mcptasks.models import Task; t = Task.objects.select_related('tenant','principal')"
        f".get(task_id='{tid}'); print(t.tenant.slug, t.principal.name)",
    )
    assert out.splitlines()[-1] == "acme alice"
    for c, t in ((alice, tid), (bob, bob_task["taskId"]), (eve, eve_task["taskId"])):
        assert c.request("tasks/cancel", {"taskId": t}).result["status"] == "cancelled"
        c.close()


def test_tasks_list_declared_for_authenticated_callers(stack: Stack, auth_server: Proc) -> None:
    with McpClient(auth_server.url, token=stack.token("acme", "alice")) as c:
        caps = c.initialize().result["capabilities"]
        assert caps["tasks"]["list"] == {}
        assert "cancel" in caps["tasks"]


def test_task_reachable_from_a_new_session_of_the_same_principal(stack: Stack, auth_server: Proc) -> None:
    token = stack.token("acme", "carla")
    with McpClient(auth_server.url, token=token) as first:
        first.initialize()
        task = first.call_task("demo_sleep", {"ms": 100})
        # The session ends; the task is bound to the auth context, not to the session.
        assert first.http.delete(first.url, headers=first.headers()).status_code == 204
    # Another token of the same principal, another session.
    with McpClient(auth_server.url, token=stack.token("acme", "carla")) as second:
        second.initialize()
        assert second.request("tasks/get", {"taskId": task["taskId"]}).result["taskId"] == task["taskId"]
        result = second.request("tasks/result", {"taskId": task["taskId"]})
        assert result.result["content"][0]["text"] == "Slept for 100 ms"
        assert task["taskId"] in {t["taskId"] for t in second.request("tasks/list", {}).result["tasks"]}


def test_session_belongs_to_its_principal(stack: Stack, auth_server: Proc) -> None:
    with McpClient(auth_server.url, token=stack.token("acme", "alice")) as alice:
        alice.initialize()
        assert alice.request("tools/list", {}).status == 200
        for token in mint_tokens(stack, [("acme", "bob", FULL), ("evilcorp", "alice", FULL)]):
            with McpClient(auth_server.url, token=token) as thief:
                thief.session_id = alice.session_id
                reply = thief.request("tools/list", {})
                assert reply.status == 404, reply.body
                assert thief.http.delete(thief.url, headers=thief.headers()).status_code == 404
        # The owner's session is untouched.
        assert alice.request("ping", {}).status == 200


def test_tenant_wide_scope_sees_every_task_of_its_tenant_only(stack: Stack, auth_server: Proc) -> None:
    tokens = mint_tokens(
        stack,
        [
            ("globex", "alice", FULL),
            ("globex", "bob", FULL),
            ("initech", "alice", FULL),
            ("globex", "ops", FULL + " mcp:tasks:tenant"),
        ],
    )
    alice, bob, other, admin = (_client(auth_server, t) for t in tokens)
    a = alice.call_task("demo_sleep", {"ms": 60_000})["taskId"]
    b = bob.call_task("demo_sleep", {"ms": 60_000})["taskId"]
    o = other.call_task("demo_sleep", {"ms": 60_000})["taskId"]
    listed = {t["taskId"] for t in admin.request("tasks/list", {}).result["tasks"]}
    assert {a, b} <= listed and o not in listed
    assert admin.request("tasks/get", {"taskId": a}).result["status"] == "working"
    # Another tenant's task stays invisible even with the tenant-wide scope.
    assert admin.request("tasks/get", {"taskId": o}).error == {"code": -32602, "message": NOT_FOUND}
    # The tenant-wide scope may also cancel (an operator stopping a runaway task).
    assert admin.request("tasks/cancel", {"taskId": b}).result["status"] == "cancelled"
    assert bob.request("tasks/get", {"taskId": b}).result["status"] == "cancelled"
    # Without the scope, alice still sees only her own.
    assert {t["taskId"] for t in alice.request("tasks/list", {}).result["tasks"]} == {a}
    for c, t in ((alice, a), (other, o)):
        c.request("tasks/cancel", {"taskId": t})
    for c in (alice, bob, other, admin):
        c.close()


def _assert_scope_challenge(reply: Any, scope: str) -> None:
    assert reply.status == 403, reply.body
    challenge = reply.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert 'error="insufficient_scope"' in challenge
    assert f'scope="{scope}"' in challenge
    assert 'resource_metadata="http://127.0.0.1:' in challenge
    assert reply.message["error"]["data"] == {"scope": scope}
    assert reply.message["id"] is not None  # a JSON-RPC error response to that request


def test_missing_scope_is_403_insufficient_scope(stack: Stack, auth_server: Proc) -> None:
    tasks_only, tools_only = mint_tokens(
        stack, [("acme", "tasksonly", "mcp:tasks"), ("acme", "toolsonly", "mcp:tools")]
    )
    with McpClient(auth_server.url, token=tasks_only) as c:
        c.initialize()  # no scope needed to initialize
        _assert_scope_challenge(c.request("tools/list", {}), "mcp:tools")
        _assert_scope_challenge(c.call("demo_quick", {}), "mcp:tools")
        task = c.call_task("demo_sleep", {"ms": 10})  # task-augmented calls need mcp:tasks
        assert c.request("tasks/get", {"taskId": task["taskId"]}).status == 200
    with McpClient(auth_server.url, token=tools_only) as c:
        c.initialize()
        assert c.request("tools/list", {}).status == 200
        _assert_scope_challenge(c.call("demo_sleep", {"ms": 10}, task={}), "mcp:tasks")
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            _assert_scope_challenge(c.request(method, {"taskId": task["taskId"]}), "mcp:tasks")
        _assert_scope_challenge(c.request("tasks/list", {}), "mcp:tasks")


# --- anonymous mode ------------------------------------------------------------------------


def test_anonymous_mode(stack: Stack, server: Proc) -> None:
    """``server`` runs with MCPTASKS_ALLOW_ANONYMOUS=1 (the stack default)."""
    with McpClient(server.url) as anon:
        caps = anon.initialize().result["capabilities"]
        assert "list" not in caps["tasks"]  # task ids are the only protection: no listing
        assert anon.request("tasks/list", {}).error["code"] == -32601
        task = anon.call_task("demo_sleep", {"ms": 10})
        with McpClient(server.url) as anon2:  # any anonymous caller knowing the id reaches it
            anon2.initialize()
            assert anon2.request("tasks/get", {"taskId": task["taskId"]}).result["taskId"] == task["taskId"]
        # ... but not an authenticated principal (tokens still work and still bind).
        with McpClient(server.url, token=stack.token("acme", "alice")) as alice:
            assert alice.initialize().result["capabilities"]["tasks"]["list"] == {}
            assert alice.request("tasks/get", {"taskId": task["taskId"]}).error["message"] == NOT_FOUND
    out = _shell(
        stack,
        "from mcptasks.models import Task; t = Task.objects.select_related('tenant','principal')"
        f".get(task_id='{task['taskId']}'); print(t.tenant.slug, t.principal.kind)",
    )
    assert out.splitlines()[-1] == "default anonymous"


@pytest.mark.parametrize(("anonymous", "debug", "warned"), [("1", "0", True), ("1", "1", False), ("0", "0", False)])
def test_system_check_warns_about_anonymous_without_debug(
    stack: Stack, anonymous: str, debug: str, warned: bool
) -> None:
    env = {"MCPTASKS_ALLOW_ANONYMOUS": anonymous, "DEBUG": debug}
    out = stack.manage("check", extra_env=env)
    text = out.stdout + out.stderr
    assert ("tenants.W001" in text) is warned, text
    if warned:
        assert "MCPTASKS_ALLOW_ANONYMOUS" in text
