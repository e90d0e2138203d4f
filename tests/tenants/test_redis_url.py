"""REDIS_URL: Sentinel URLs parsed and used by every client, unsupported ones refused at check time."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from tenants import kv
from tenants.auth import AuthContext
from tenants.checks import redis_url_supported
from tenants.infra import redis_url
from tenants.models import Tenant
from tenants.ratelimit import RateLimited, check_rate
from tenants.selectors import clear_limits_cache
from tests.support.clock import frozen_clock
from tests.support.fast_subset import starts_processes
from tests.support.requirements import require_redis
from tests.support.sentinel_proc import SERVICE, PrivateSentinel
from tests.support.servers import free_port
from tests.support.waiting import wait_for

SECRET = "s3cr3t-pw"


@pytest.mark.parametrize(
    ("url", "hosts", "service", "db", "password"),
    [
        ("redis+sentinel://h1:26379/mymaster", (("h1", 26379),), "mymaster", 0, None),
        ("redis+sentinel://h1:26379,h2:26380,10.0.0.3:5000/svc.main/3",
         (("h1", 26379), ("h2", 26380), ("10.0.0.3", 5000)), "svc.main", 3, None),
        (f"redis+sentinel://:{SECRET}@h1:1/m/", (("h1", 1),), "m", 0, SECRET),
        ("redis+sentinel://:p%40ss@[::1]:26379/m/1", (("::1", 26379),), "m", 1, "p@ss"),
    ],
)
def test_sentinel_urls_are_parsed(url: str, hosts: Any, service: str, db: int, password: str | None) -> None:
    target = redis_url.parse(url)
    assert target.is_sentinel
    assert (target.sentinels, target.service, target.db, target.password) == (hosts, service, db, password)
    assert SECRET not in target.describe()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://:pw@h:6380/2", "unix:///tmp/redis.sock?db=1"])
def test_single_server_urls_are_accepted(url: str) -> None:
    assert not redis_url.parse(url).is_sentinel
    assert redis_url.problems(url, probe=False) == []


@pytest.mark.parametrize(
    ("url", "code", "words"),
    [
        (f"redis+sentinel://:{SECRET}@h1:26379", "E010", "name the Sentinel service"),
        (f"redis+sentinel://:{SECRET}@h1:26379/", "E010", "name the Sentinel service"),
        (f"redis+sentinel://:{SECRET}@h1/m", "E010", "host:port"),
        ("redis+sentinel://h1:99999/m", "E010", "host:port"),
        ("redis+sentinel://h1:1,,h2:2/m", "E010", "host:port"),
        ("redis+sentinel://h1:1/m/x", "E010", "must be a number"),
        ("redis+sentinel://h1:1/m/0/extra", "E010", "/SERVICE[/DB]"),
        ("redis+sentinel://h1:1/m?ssl=1", "E010", "no query"),
        ("redis+sentinel://h 1:1/m", "E010", "host:port"),
        (f"redis+cluster://:{SECRET}@h1:7000", "E011", "Redis Cluster is not supported"),
        ("rediss+cluster://h1:7000", "E011", "Redis Cluster is not supported"),
        (f"http://:{SECRET}@h1:1/", "E010", "not supported"),
        ("127.0.0.1:6379", "E010", "not supported"),
        (f"redis://:{SECRET}@h:port/0", "E010", "malformed"),
    ],
)
@pytest.mark.django_db
def test_unsupported_or_malformed_urls_are_refused_by_check(settings: Any, url: str, code: str, words: str) -> None:
    settings.REDIS_URL = url
    errors = redis_url_supported()
    assert [e.id for e in errors] == [f"tenants.{code}"]
    assert words in errors[0].msg
    assert SECRET not in errors[0].msg, "a password must never reach a message"
    with pytest.raises(SystemCheckError, match=code):
        call_command("check")


def test_a_valid_sentinel_url_passes_check(settings: Any) -> None:
    settings.REDIS_URL = "redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster/0"
    assert redis_url_supported() == []


def test_a_refused_url_never_turns_a_request_into_an_error(settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A process started anyway (check skipped) degrades to its local store, logging once."""
    settings.REDIS_URL = f"redis+cluster://:{SECRET}@127.0.0.1:7000"
    kv.reset()
    caplog.set_level(logging.ERROR, logger="tenants.kv")
    try:
        for _ in range(5):
            assert kv.call(lambda r: r.incr("k"), fallback=lambda store: store.incr("k", ttl_s=60)) >= 1
        assert asyncio.run(kv.acall(lambda r: r.incr("k"), fallback=lambda store: -1)) == -1
        assert len([r for r in caplog.records if "Cluster" in r.getMessage()]) == 1
        assert SECRET not in caplog.text
    finally:
        kv.reset()


@pytest.fixture
@starts_processes
def cluster_node(tmp_path: Path) -> Iterator[str]:
    """A lone ``redis-server --cluster-enabled yes`` (no slots assigned: INFO still says so)."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed"
    def port_for_the_cluster_bus() -> int | None:
        port = free_port()
        return port if port <= 55535 else None  # the cluster bus listens on port + 10000: above, no start

    port = wait_for("a free port below 55536", port_for_the_cluster_bus, timeout=5, every=0)
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path), "--cluster-config-file", str(tmp_path / "nodes.conf")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        def up() -> bool:
            try:
                return bool(redis.Redis(port=port, socket_timeout=0.5).ping())
            except redis.ConnectionError:
                return False

        wait_for("the cluster node to start", up, timeout=30)  # a loaded CI machine took over 10 s once
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(10)


def test_a_cluster_node_behind_a_redis_url_is_refused(settings: Any, cluster_node: str) -> None:
    require_redis()
    settings.REDIS_URL = cluster_node
    errors = redis_url_supported()
    assert [e.id for e in errors] == ["tenants.E011"]
    assert "cluster_enabled:1" in errors[0].msg
    with pytest.raises(Exception, match="refuses to start"):
        redis_url.require_supported(cluster_node, "web process")


def test_a_plain_redis_and_an_unreachable_one_pass_check(settings: Any) -> None:
    require_redis()
    assert redis_url.cluster_enabled(str(settings.REDIS_URL)) is False
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    assert redis_url_supported() == [], "an unreachable Redis degrades, it does not refuse the start"


# --- a real Sentinel deployment ------------------------------------------------------------------


def _auth(tenant: Tenant) -> AuthContext:
    return AuthContext(tenant_id=tenant.pk, tenant_slug=tenant.slug, principal_id=1, principal_name="p")


def _primary_keys(sentinel: PrivateSentinel) -> list[bytes]:
    node = sentinel.node(sentinel.primary_port())
    assert node is not None
    return list(node.client().keys("*:rl:*"))


@pytest.mark.django_db
def test_rate_limits_count_on_the_sentinel_primary(settings: Any, tenant: Tenant, sentinel: PrivateSentinel) -> None:
    """Was an HTTP 500 (ValueError from redis-py's from_url outside kv's error handling)."""
    settings.REDIS_URL = sentinel.url
    kv.reset()
    Tenant.objects.filter(pk=tenant.pk).update(rate_create_per_min=3)
    clear_limits_cache()
    try:
        for _ in range(3):
            check_rate(auth=_auth(tenant), op_class="create")
        with pytest.raises(RateLimited):
            check_rate(auth=_auth(tenant), op_class="create")
        assert not kv.breaker.is_open
        assert _primary_keys(sentinel), "the counters must live on the primary the Sentinels name"
        assert asyncio.run(kv.acall(lambda r: r.ping(), fallback=lambda store: False)) is True
    finally:
        kv.reset()


@pytest.mark.django_db
def test_counters_follow_a_failover(settings: Any, sentinel: PrivateSentinel,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """After SENTINEL FAILOVER the same client writes to the new primary within seconds, logging little."""
    settings.REDIS_URL = sentinel.url
    settings.TENANTS = {**settings.TENANTS, "REDIS_BREAKER_S": 0.2}
    kv.reset()
    caplog.set_level(logging.WARNING, logger="tenants.kv")
    key = kv.key("failover-probe")
    try:
        assert kv.call(lambda r: r.incr(key), fallback=lambda store: 0) == 1
        new_port = sentinel.failover()
        wait_for("the counters client to reach the new primary",
                 lambda: kv.call(lambda r: r.incr(key), fallback=lambda store: 0) > 0 and not kv.breaker.is_open,
                 timeout=10)
        node = sentinel.node(new_port)
        assert node is not None and node.client().get(key) is not None
        assert len(caplog.records) <= 2, [r.getMessage() for r in caplog.records]
        sentinel.wait_settled()
    finally:
        kv.reset()


def test_a_blocked_read_leaves_the_old_primary_whoever_notices_the_move(sentinel: PrivateSentinel) -> None:
    """A new connection that learns of the failover first must not leave a blocked read behind.

    redis-py updates the pool's address on a new connection but drops only idle connections; the
    pool's watch then saw the address already current and did nothing, and a worker's BZPOPMIN
    stayed on the demoted primary for the read's whole timeout (its wake-ups went to the new one).
    """
    import asyncio

    from redis import asyncio as aioredis

    from tenants.infra import redis_pools

    async def scenario() -> float:
        pool = redis_pools.async_pool(sentinel.url, max_connections=10, timeout=5)
        client = aioredis.Redis(connection_pool=pool)
        try:
            await client.set("blocked-read-probe", 1)
            # The timing below is the read's, not the Sentinels' readiness after the last failover.
            await asyncio.to_thread(sentinel.wait_promotable)
            started = asyncio.get_running_loop().time()
            read = asyncio.ensure_future(client.bzpopmin("blocked-read-probe-q", timeout=20))
            primary = sentinel.node(sentinel.primary_port())
            assert primary is not None
            await asyncio.to_thread(wait_for, "the read to block on the primary",
                                    lambda: primary.client().info("clients")["blocked_clients"] >= 1, timeout=10)
            await asyncio.to_thread(sentinel.failover)
            # What a new connection does on connect: it asks the Sentinels first.
            await pool.get_master_address()
            try:
                await asyncio.wait_for(read, timeout=20)
            except Exception:
                pass
            return asyncio.get_running_loop().time() - started
        finally:
            await client.aclose()
            await pool.disconnect()

    took = asyncio.run(scenario())
    sentinel.wait_settled()
    # Ends with the move (a second or two), not after the read's 20 s timeout.
    assert took < 10, took


def test_service_name_is_the_sentinel_service() -> None:
    assert SERVICE == redis_url.parse(f"redis+sentinel://h:1/{SERVICE}").service


@pytest.mark.processes(reason="two private redis-server processes")
def test_a_single_server_turned_replica_is_reconnected_not_kept(settings: Any, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """READONLY drops the connection (a reconnect resolves the name again: DNS-based failovers),
    the call degrades to the local store, and the client works again once the server leads."""
    require_redis()
    from tests.support.redis_proc import PrivateRedis

    primary, other = PrivateRedis(tmp_path), PrivateRedis(tmp_path)
    primary.start()
    other.start()
    settings.REDIS_URL = primary.url
    settings.TENANTS = {**settings.TENANTS, "REDIS_BREAKER_S": 0.1}
    kv.reset()
    admin = redis.Redis(port=primary.port)
    try:
        # The breaker opened by each failure stays open until the clock is moved past REDIS_BREAKER_S.
        with frozen_clock(monkeypatch, kv) as clock:
            assert kv.call(lambda r: r.incr("n"), fallback=lambda store: -1) == 1
            admin.replicaof("127.0.0.1", other.port)
            assert kv.call(lambda r: r.incr("n"), fallback=lambda store: -1) == -1
            pool = kv.client().connection_pool
            assert all(c._sock is None for c in pool._connections), "the connection to the replica was kept"

            async def async_side() -> Any:
                value = await kv.acall(lambda r: r.incr("n"), fallback=lambda store: -1)
                c = kv.aclient().connection_pool
                return value, [x for x in c._available_connections if x.is_connected]

            clock.advance(0.15)
            assert asyncio.run(async_side()) == (-1, [])
            admin.replicaof("no", "one")
            clock.advance(0.15)
            assert kv.call(lambda r: r.set("m", 1), fallback=lambda store: False) is True
    finally:
        kv.reset()
        admin.close()
        primary.stop()
        other.stop()


# --- which primary the Sentinels name -------------------------------------------------------------


class _FakeSentinel:
    """A Sentinel answering SENTINEL MASTERS with one fixed view of the service."""

    def __init__(self, ip: str, port: int, epoch: int) -> None:
        self.state = {"ip": ip, "port": port, "config-epoch": epoch, "is_master": True,
                      "is_sdown": False, "is_odown": False, "num-other-sentinels": 2}

    def sentinel_masters(self) -> dict[str, Any]:
        return {"svc": self.state}


class _AsyncFakeSentinel(_FakeSentinel):
    async def sentinel_masters(self) -> dict[str, Any]:  # type: ignore[override]
        return {"svc": self.state}


def _views(cls: type[_FakeSentinel]) -> list[_FakeSentinel]:
    # The first Sentinel has not heard of the failover yet: it still names the old primary (a
    # killed primary just restarted, answering as a primary until it is turned into a replica).
    return [cls("10.0.0.1", 6379, 1), cls("10.0.0.2", 6379, 2), cls("10.0.0.2", 6379, 2)]


def test_the_newest_epoch_names_the_primary_not_the_first_sentinel() -> None:
    """Found by the Sentinel failover test: a process that asked a Sentinel which had not yet
    heard of the failover reconnected to the restarted old primary, and its stream's blocking
    read and group memberships stayed there (a tasks/result stream that never answered)."""
    from redis import sentinel as ssentinel

    from tenants.infra.redis_sentinel import EpochSentinel, _newest_primary

    manager = EpochSentinel([("127.0.0.1", 1)])
    manager.sentinels = _views(_FakeSentinel)  # type: ignore[assignment]
    assert manager.discover_master("svc") == ("10.0.0.2", 6379)
    # redis-py's own rule (the first Sentinel that answers) picks the stale one: the bug.
    plain = ssentinel.Sentinel([("127.0.0.1", 1)])
    plain.sentinels = _views(_FakeSentinel)  # type: ignore[assignment]
    assert plain.discover_master("svc") == ("10.0.0.1", 6379)
    # The same epoch everywhere: most Sentinels win.
    assert _newest_primary([{"ip": "a", "port": 1, "config-epoch": 3}, {"ip": "b", "port": 1, "config-epoch": 3},
                            {"ip": "b", "port": 1, "config-epoch": 3}]) == ("b", 1)
    with pytest.raises(ssentinel.MasterNotFoundError):
        empty = EpochSentinel([("127.0.0.1", 1)])
        empty.sentinels = []
        empty.discover_master("svc")


async def test_the_async_manager_trusts_the_newest_epoch_too() -> None:
    from tenants.infra.redis_sentinel import AsyncEpochSentinel

    manager = AsyncEpochSentinel([("127.0.0.1", 1)])
    manager.sentinels = _views(_AsyncFakeSentinel)  # type: ignore[assignment]
    assert await manager.discover_master("svc") == ("10.0.0.2", 6379)
