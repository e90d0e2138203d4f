"""A private Redis Sentinel deployment for failover tests: a primary, a replica, three Sentinels.

Everything listens on free loopback ports and keeps its files in a temporary folder (never the
shared Redis). Modelled on :mod:`tests.support.redis_proc`; the data nodes are
:class:`PrivateNode` processes a test may kill and restart (a restarted old primary is turned
into a replica by the Sentinels, as in production).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from tests.support.servers import free_port

SERVICE = "mymaster"


def _wait(predicate: object, *, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if predicate():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError) as exc:
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"sentinel deployment: {what} not reached within {within_s} s (last error: {last!r})")


class _Proc:
    """One redis-server process (a data node or a Sentinel) with its config file and log."""

    def __init__(self, tmp: Path, name: str, config: str, *, sentinel: bool = False, host: str = "127.0.0.1") -> None:
        self.tmp = tmp
        self.host = host
        self.name = name
        self.port = free_port()
        self.config = config
        self.sentinel = sentinel
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed"
        folder = self.tmp / self.name
        folder.mkdir(exist_ok=True)
        conf = folder / "redis.conf"
        if not conf.exists() or not self.sentinel:
            # A Sentinel rewrites its own file (what it learnt): keep it across restarts.
            # Protected mode refuses clients from anywhere but loopback when there is no
            # password: off for a bridge address (the network is private to the test).
            protected = "" if self.host == "127.0.0.1" else "protected-mode no\n"
            conf.write_text(f"port {self.port}\nbind {self.host}\n{protected}dir {folder}\n{self.config}")
        args = [binary, str(conf)] + (["--sentinel"] if self.sentinel else [])
        with open(folder / "log", "ab") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        _wait(lambda: self.client().ping(), within_s=10, what=f"{self.name} answering")

    def client(self) -> Any:
        return redis.Redis(host=self.host, port=self.port, socket_timeout=1, socket_connect_timeout=1)

    def stop(self) -> None:
        """Kill it: every client connection drops at once."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class PrivateSentinel:
    """A primary + replica + 3 Sentinels monitoring them as :data:`SERVICE`.

    Everything binds ``host`` (loopback by default; a bridge's address when the clients run in
    network namespaces, since the Sentinels hand that address out as the primary's).
    """

    def __init__(self, tmp: Path, *, down_after_ms: int = 1000, host: str = "127.0.0.1") -> None:
        data = "save \"\"\nappendonly no\nrepl-diskless-sync yes\nrepl-diskless-sync-delay 0\n"
        self.host = host
        self.down_after_ms = down_after_ms
        self.nodes = [_Proc(tmp, "node-a", data, host=host), _Proc(tmp, "node-b", data, host=host)]
        self.nodes[1].config += f"replicaof {host} {self.nodes[0].port}\n"
        primary = self.nodes[0].port
        sentinel_conf = (
            f"sentinel monitor {SERVICE} {host} {primary} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        self.sentinels = [_Proc(tmp, f"sentinel-{i}", sentinel_conf, sentinel=True, host=host) for i in range(3)]

    @property
    def url(self) -> str:
        """``redis+sentinel://`` URL of the deployment (database 0)."""
        hosts = ",".join(f"{self.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> None:
        """Start everything and wait until every Sentinel knows the replica and its peers."""
        for node in self.nodes:
            node.start()
        _wait(lambda: self.nodes[1].client().info("replication").get("master_link_status") == "up",
              within_s=15, what="replica in sync")
        for s in self.sentinels:
            s.start()
        self.wait_settled()

    def wait_settled(self, *, within_s: float = 30) -> None:
        """Every Sentinel names the same primary, knows a replica and the two other Sentinels."""
        def settled() -> bool:
            primary = self.primary_port()
            for s in self.sentinels:
                c = s.client()
                if c.sentinel_get_master_addr_by_name(SERVICE)[1] != primary:
                    return False
                if not [r for r in c.sentinel_slaves(SERVICE) if "s_down" not in r.get("flags", "")]:
                    return False
                if len(c.sentinel_sentinels(SERVICE)) < 2:
                    return False
            node = self.node(primary)
            return node is not None and node.client().info("replication")["role"] == "master"

        _wait(settled, within_s=within_s, what="sentinels settled")

    def primary_port(self) -> int:
        """The port the first live Sentinel names as the primary."""
        for s in self.sentinels:
            if s.alive:
                return int(s.client().sentinel_get_master_addr_by_name(SERVICE)[1])
        raise RuntimeError("no Sentinel alive")

    def node(self, port: int) -> _Proc | None:
        """The data node listening on ``port``."""
        return next((n for n in self.nodes if n.port == port), None)

    def wait_promotable(self, *, within_s: float = 30) -> None:
        """Wait until the first Sentinel would pick a replica for a forced failover, and it is in sync.

        The Sentinel's rules (``sentinelSelectSlave``): not down or disconnected, a PING reply within
        5 s, an INFO within 30 s, the replication link down no longer than ten ``down-after``
        periods. Right after a failover the demoted primary fails them for a second or so; it is
        also not in sync yet, and promoting it then would lose what the test just wrote. Its own
        INFO tells that at once (the Sentinel's copy of it is up to 10 s old).
        """
        def promotable(replica: dict[str, Any]) -> bool:
            flags = str(replica.get("flags", ""))
            if (any(f in flags for f in ("s_down", "o_down", "disconnected"))
                    or int(replica.get("last-ok-ping-reply", 10**9)) >= 5000
                    or int(replica.get("info-refresh", 10**9)) >= 30000
                    or int(replica.get("master-link-down-time", 0)) > 10 * self.down_after_ms
                    or int(replica.get("slave-priority", 1)) == 0):
                return False
            node = self.node(int(replica.get("port", 0)))
            return node is not None and node.client().info("replication").get("master_link_status") == "up"

        _wait(lambda: any(promotable(r) for r in self.sentinels[0].client().sentinel_slaves(SERVICE)),
              within_s=within_s, what="a promotable replica")

    def failover(self, *, within_s: float = 20) -> int:
        """``SENTINEL FAILOVER``: promote the replica; return the new primary's port once it leads."""
        old = self.primary_port()
        self.wait_promotable()

        def ordered() -> bool:
            # wait_promotable reads the Sentinel's view a moment before this; should that view lapse
            # meanwhile (NOGOODSLAVE) or the last failover's reconfiguration still run (INPROG), ask again.
            try:
                self.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", SERVICE)
            except redis.ResponseError as exc:
                if str(exc).startswith(("NOGOODSLAVE", "INPROG")):
                    return False
                raise
            return True

        _wait(ordered, within_s=within_s + 15, what="a Sentinel accepting the failover")

        def switched() -> bool:
            if any(s.client().sentinel_get_master_addr_by_name(SERVICE)[1] == old for s in self.sentinels):
                return False
            new = self.node(self.primary_port())
            return new is not None and new.client().info("replication")["role"] == "master"

        _wait(switched, within_s=within_s, what="failover")
        return self.primary_port()

    def stop(self) -> None:
        """Kill every process."""
        for p in [*self.sentinels, *self.nodes]:
            p.stop()
