"""REDIS_URL: Sentinel URLs parsed and used by every client, unsupported ones refused at check time."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from tenants import kv, redis_url
from tenants.auth import AuthContext
from tenants.checks import redis_url_supported
from tenants.models import Tenant
from tenants.ratelimit import RateLimited, check_rate
from tenants.selectors import clear_limits_cache
from tests.support.requirements import require_redis
from tests.support.sentinel_proc import SERVICE, PrivateSentinel
from tests.support.servers import free_port

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
def cluster_node(tmp_path: Path) -> Iterator[str]:
    """A lone ``redis-server --cluster-enabled yes`` (no slots assigned: INFO still says so)."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed"
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path), "--cluster-config-file", str(tmp_path / "nodes.conf")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port, socket_timeout=0.5).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "cluster node did not start"
                time.sleep(0.05)
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


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSentinel]:
    require_redis()
    s = PrivateSentinel(Path(tmp_path_factory.mktemp("sentinel")))
    s.start()
    yield s
    s.stop()


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
        deadline = time.monotonic() + 10
        while True:
            if kv.call(lambda r: r.incr(key), fallback=lambda store: 0) > 0 and not kv.breaker.is_open:
                break
            assert time.monotonic() < deadline, "the counters client never reached the new primary"
            time.sleep(0.05)
        node = sentinel.node(new_port)
        assert node is not None and node.client().get(key) is not None
        assert len(caplog.records) <= 2, [r.getMessage() for r in caplog.records]
        sentinel.wait_settled()
    finally:
        kv.reset()


def test_service_name_is_the_sentinel_service() -> None:
    assert SERVICE == redis_url.parse(f"redis+sentinel://h:1/{SERVICE}").service


def test_a_single_server_turned_replica_is_reconnected_not_kept(settings: Any, tmp_path: Path) -> None:
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
        assert kv.call(lambda r: r.incr("n"), fallback=lambda store: -1) == 1
        admin.replicaof("127.0.0.1", other.port)
        assert kv.call(lambda r: r.incr("n"), fallback=lambda store: -1) == -1
        pool = kv.client().connection_pool
        assert all(c._sock is None for c in pool._connections), "the connection to the replica was kept"

        async def async_side() -> Any:
            value = await kv.acall(lambda r: r.incr("n"), fallback=lambda store: -1)
            c = kv.aclient().connection_pool
            return value, [x for x in c._available_connections if x.is_connected]

        time.sleep(0.15)
        assert asyncio.run(async_side()) == (-1, [])
        admin.replicaof("no", "one")
        time.sleep(0.15)
        assert kv.call(lambda r: r.set("m", 1), fallback=lambda store: False) is True
    finally:
        kv.reset()
        admin.close()
        primary.stop()
        other.stop()
