"""Quotas and rate limits through real daphne processes sharing one database and one Redis.

A concurrency limit of 10 holds under 200 simultaneous creations spread over three daphne
processes, and slots come back when tasks end. A read budget is shared by two processes,
answered with HTTP 429 + ``Retry-After`` + a JSON-RPC error, and polling faster than
``pollInterval`` costs extra.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.e2e.test_tenancy import mint_tokens
from tests.support.client import McpClient
from tests.support.requirements import require_multiprocess
from tests.support.servers import Proc, Stack

QUOTA_EXCEEDED = -32010
RATE_LIMITED = -32011
FULL = "mcp:tools mcp:tasks"


@pytest.fixture(scope="module")
def servers(stack: Stack) -> Iterator[list[Proc]]:
    """Three authenticated-only daphnes on PostgreSQL + Redis, one on SQLite. No worker runs:
    every task stays ``working`` until it is cancelled."""
    env = {"MCPTASKS_ALLOW_ANONYMOUS": "0", "MCPTASKS_EMBEDDED_WORKER": "0"}
    procs = [stack.daphne(embedded_worker=False, extra_env=env) for _ in range(3 if stack.multi_process else 1)]
    yield procs
    for p in procs:
        p.terminate(timeout=10)


def _set_limits(stack: Stack, slug: str, **fields: int) -> None:
    assignments = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    stack.manage(
        "shell", "-c", f"from tenants.models import Tenant; Tenant.objects.filter(slug={slug!r}).update({assignments})"
    )


def _shell_value(stack: Stack, code: str) -> str:
    return stack.manage("shell", "-c", code).stdout.strip().splitlines()[-1]


def test_200_concurrent_creations_against_a_limit_of_10(stack: Stack, servers: list[Proc]) -> None:
    require_multiprocess()
    principals = [f"p{i}" for i in range(4)]
    tokens = mint_tokens(stack, [("quota10", p, FULL) for p in principals])
    _set_limits(stack, "quota10", max_concurrent_tasks=10)
    n_threads, per_thread = 20, 10
    clients = []
    for i in range(n_threads):  # each thread: its own session, principal and server round-robin
        c = McpClient(servers[i % len(servers)].url, token=tokens[i % len(tokens)])
        c.initialize()
        clients.append(c)
    barrier = threading.Barrier(n_threads)

    def run(c: McpClient) -> list[tuple[McpClient, dict[str, Any]]]:
        barrier.wait()
        out = []
        for _ in range(per_thread):
            out.append((c, c.call("demo_sleep", {"ms": 600_000}, task={}).message or {}))
        return out

    with ThreadPoolExecutor(n_threads) as pool:
        replies = [r for chunk in pool.map(run, clients) for r in chunk]
    assert len(replies) == 200
    created = [(c, m["result"]["task"]["taskId"]) for c, m in replies if "result" in m]
    refused = [m["error"] for _c, m in replies if "error" in m]
    assert len(created) == 10, [m for _c, m in replies if "result" not in m and "error" not in m]
    assert len(refused) == 190
    for err in refused:
        assert err["code"] == QUOTA_EXCEEDED, err
        assert err["data"] == {"limit": 10, "scope": "tenant"}
        assert "limit 10" in err["message"]
    # The database agrees: exactly 10 live tasks, and the counter says so too.
    counts = _shell_value(
        stack,
        "from mcptasks.models import Task; from tenants.models import Tenant; t = Tenant.objects.get(slug='quota10'); "
        "print(Task.objects.filter(tenant=t, kind='task').exclude(status__in=['completed','failed','cancelled'])"
        ".count(), Task.objects.filter(tenant=t).count(), t.active_tasks)",
    )
    assert counts == "10 10 10"  # nothing was created for a refused call
    # Each principal lists exactly its own share of the ten.
    listed: set[str] = set()
    for c in clients[: len(tokens)]:
        listed |= {t["taskId"] for t in c.request("tasks/list", {}).result["tasks"]}
    assert listed == {tid for _c, tid in created}

    for c, tid in created:
        assert c.request("tasks/cancel", {"taskId": tid}).result["status"] == "cancelled"
    assert (
        _shell_value(stack, "from tenants.models import Tenant; print(Tenant.objects.get(slug='quota10').active_tasks)")
        == "0"
    )
    # Slots are back: ten new tasks fit again, the eleventh does not.
    fresh = [clients[i].call_task("demo_sleep", {"ms": 600_000})["taskId"] for i in range(10)]
    assert clients[10].call("demo_sleep", {"ms": 1}, task={}).error["data"] == {"limit": 10, "scope": "tenant"}
    for i, tid in enumerate(fresh):
        clients[i].request("tasks/cancel", {"taskId": tid})
    for c in clients:
        c.close()


def test_per_principal_limit(stack: Stack, servers: list[Proc]) -> None:
    alice, bob = mint_tokens(stack, [("perprin", "alice", FULL), ("perprin", "bob", FULL)])
    _set_limits(stack, "perprin", max_concurrent_tasks_per_principal=2)
    with McpClient(servers[0].url, token=alice) as a, McpClient(servers[-1].url, token=bob) as b:
        a.initialize()
        b.initialize()
        mine = [a.call_task("demo_sleep", {"ms": 600_000})["taskId"] for _ in range(2)]
        err = a.call("demo_sleep", {"ms": 1}, task={}).error
        assert err["code"] == QUOTA_EXCEEDED and err["data"] == {"limit": 2, "scope": "principal"}
        theirs = b.call_task("demo_sleep", {"ms": 600_000})["taskId"]  # bob has his own budget
        a.request("tasks/cancel", {"taskId": mine[0]})
        mine.append(a.call_task("demo_sleep", {"ms": 600_000})["taskId"])  # a slot came back
        for tid in mine[1:]:
            a.request("tasks/cancel", {"taskId": tid})
        b.request("tasks/cancel", {"taskId": theirs})


def _assert_429(reply: Any, rid: int, limit: int) -> None:
    assert reply.status == 429, reply.body
    assert int(reply.headers["retry-after"]) >= 1
    assert reply.message["id"] == rid
    err = reply.message["error"]
    assert err["code"] == RATE_LIMITED
    assert err["data"]["limit"] == limit and err["data"]["opClass"] == "read"
    assert err["data"]["retryAfterS"] == int(reply.headers["retry-after"])


def test_read_rate_limit_shared_across_processes(stack: Stack, servers: list[Proc]) -> None:
    alice, bob = mint_tokens(stack, [("rl5", "alice", FULL), ("rl5", "bob", FULL)])
    # pollInterval 1 ms: no poll here is "too fast", each read costs exactly one.
    _set_limits(stack, "rl5", rate_read_per_min=5, poll_interval_ms=1)
    a = McpClient(servers[0].url, token=alice)
    b = McpClient(servers[-1].url, token=bob)  # another process when several run
    a.initialize()
    b.initialize()
    tid = a.call_task("demo_sleep", {"ms": 600_000})["taskId"]  # creation: not a read
    own = b.call_task("demo_sleep", {"ms": 600_000})["taskId"]
    for i in range(5):  # five reads of the tenant, alternating processes and principals
        c, t = (a, tid) if i % 2 == 0 else (b, own)
        assert c.request("tasks/get", {"taskId": t}).status == 200, i
    _assert_429(b.request("tasks/get", {"taskId": own}, rid=4242), 4242, 5)
    _assert_429(a.request("tasks/list", {}, rid=4243), 4243, 5)  # tasks/list is a read too
    # Other classes have their own budgets.
    assert a.request("tools/list", {}).status == 200
    assert a.request("tasks/cancel", {"taskId": tid}).status == 200
    assert b.request("tasks/cancel", {"taskId": own}).status == 200
    a.close()
    b.close()


def test_polling_faster_than_poll_interval_costs_extra(stack: Stack, servers: list[Proc]) -> None:
    (token,) = mint_tokens(stack, [("rlpoll", "alice", FULL)])
    _set_limits(stack, "rlpoll", rate_read_per_min=6, poll_interval_ms=60_000)
    clients = [McpClient(s.url, token=token) for s in servers[:2]]
    for c in clients:
        c.initialize()
    task = clients[0].call_task("demo_sleep", {"ms": 600_000})
    assert task["pollInterval"] == 60_000
    # Six reads are allowed, but every poll after the first comes too soon and costs two:
    # 1, then 1+1, then 1+1 = 5 spent; the fourth poll's extra read exceeds the budget.
    for i in range(3):
        assert clients[i % len(clients)].request("tasks/get", {"taskId": task["taskId"]}).status == 200, i
    _assert_429(clients[-1].request("tasks/get", {"taskId": task["taskId"]}, rid=99), 99, 6)
    clients[0].request("tasks/cancel", {"taskId": task["taskId"]})
    for c in clients:
        c.close()


def test_ttl_is_clamped_to_the_tenant_maximum(stack: Stack, servers: list[Proc]) -> None:
    (token,) = mint_tokens(stack, [("ttlcap", "alice", FULL)])
    _set_limits(stack, "ttlcap", max_ttl_ms=5_000, default_ttl_ms=60_000, poll_interval_ms=250)
    with McpClient(servers[0].url, token=token) as c:
        c.initialize()
        capped = c.call_task("demo_sleep", {"ms": 600_000}, ttl=86_400_000)
        default = c.call_task("demo_sleep", {"ms": 600_000})
        shorter = c.call_task("demo_sleep", {"ms": 600_000}, ttl=1_000)
        assert capped["ttl"] == 5_000  # the requested ttl is lowered, never refused
        assert default["ttl"] == 5_000  # the default is clamped to the maximum too
        assert shorter["ttl"] == 1_000
        assert capped["pollInterval"] == 250
        for t in (capped, default, shorter):
            c.request("tasks/cancel", {"taskId": t["taskId"]})
