"""Hosts in network namespaces: the reference deployment on one machine, with real links to cut.

Each "host" is a network namespace joined to a private bridge by a veth pair, with an address
of its own on a private /24; in it run a web process (the production server) and an ``mcptasks_worker``. The
machine's PostgreSQL and Redis listen on 127.0.0.1 only and are not reconfigured: the hosts
reach PostgreSQL through a private PgBouncer (transaction mode) listening on the bridge's
address, and Redis as a private primary + replica + 3 Sentinels bound to that address, which
is the reference deployment of docs/operations.md.

Losing a host here is the hard way: its processes are frozen (SIGSTOP) and its link is taken
down inside the namespace, so no FIN or RST ever leaves it. PgBouncer, PostgreSQL and Redis
keep its connections open, a transaction it was inside stays open holding its locks, and its
leases stop being renewed; what frees them is the service's own bounds (the transaction
timeouts and lease expiry), as on a host that lost power or its network.

Everything created is named ``mtn<4 hex>…`` (unique per run) and removed on exit, even after a
failure; a run killed outright leaves a note in :data:`STATE_DIR` naming its namespaces and
bridge, and the next run removes them once that run's process is gone.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.lost_host import HOST_ENV, Host
from tests.support.pgbouncer_proc import PrivatePgBouncer
from tests.support.sentinel_proc import PrivateSentinel
from tests.support.servers import PRODUCTION_SERVER, WEB_SERVERS, Proc, Stack, descendants, free_port, wait_healthy

PREFIX = "mtn"
STATE_DIR = Path("/run/mcptasks-netns")

#: PgBouncer's ``idle_transaction_timeout`` in the reference deployment: the backstop for a
#: transaction without the service's own bounds. One lost between ``BEGIN`` and the ``SET LOCAL``
#: of its bounds, when the driver sent them on separate round trips, stayed open with no
#: timeout at all (now they leave as one message: mcptasks/pooled_postgresql).
BACKSTOP_S = 12

#: What the hosts run with on top of :data:`tests.support.lost_host.HOST_ENV`: a transaction
#: left open by a vanished host is closed by PostgreSQL after 3 s, well inside the 10 s lock
#: timeout, so the other hosts' writes to the same tenant row wait instead of failing.
NS_ENV = {
    **HOST_ENV,
    "MCPTASKS_DB_POOLER": "transaction",
    "MCPTASKS_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS": "3000",
    "MCPTASKS_DB_LOCK_TIMEOUT_MS": "10000",
}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def unavailable() -> str | None:
    """Why this machine cannot run hosts in network namespaces, or None when it can.

    Tries what the layout needs (a namespace, a bridge, a veth pair) and removes it again.
    """
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add, veth, bridge)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` (apt-get install iproute2)"
    tag = f"{PREFIX}p{secrets.token_hex(2)}"
    try:
        for args in (("netns", "add", tag), ("link", "add", tag + "b", "type", "bridge"),
                     ("link", "add", tag + "a", "type", "veth", "peer", "name", tag + "c"),
                     ("link", "set", tag + "c", "netns", tag)):
            done = _ip(*args, check=False)
            if done.returncode != 0:
                return f"`ip {' '.join(args[:2])}` refused here: {done.stderr.strip()}"
        return None
    finally:
        _ip("link", "del", tag + "a", check=False)
        _ip("link", "del", tag + "b", check=False)
        _ip("netns", "del", tag, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_link(name: str) -> bool:
    """Bridge (``…br``) and host-side veth (``…a``) names; the others name namespaces."""
    return name.endswith(("br", "a"))


def _remove(names: list[str]) -> None:
    """Kill every process in the namespaces named, delete them and the links named.

    The host-side veth ends are deleted explicitly: a namespace whose link was cut outlives its
    deletion while orphaned TCP sockets in it retransmit into the void (minutes), and with it
    the veth pair.
    """
    for name in names:
        if _is_link(name):
            continue
        for pid in _ns_pids(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _ip("netns", "del", name, check=False)
    for name in names:
        if _is_link(name):
            _ip("link", "del", name, check=False)


def sweep_stale() -> None:
    """Remove the namespaces and bridge of earlier runs whose process is gone."""
    if not STATE_DIR.is_dir():
        return
    for note in STATE_DIR.glob(f"{PREFIX}*"):
        try:
            pid_text, *names = note.read_text().split()
            if _alive(int(pid_text)):
                continue
        except (OSError, ValueError):
            continue
        _remove([n for n in names if n.startswith(PREFIX)])
        note.unlink(missing_ok=True)


def _ns_pids(name: str) -> list[int]:
    done = _ip("netns", "pids", name, check=False)
    return [int(x) for x in done.stdout.split() if x.isdigit()]


def _free_subnet() -> ipaddress.IPv4Network:
    """A private /24 no interface of this machine uses (10.200.0.0/13 and up)."""
    used = [ipaddress.ip_interface(w).network for line in _ip("-4", "-o", "addr").stdout.splitlines()
            for i, w in enumerate(line.split()) if i > 0 and line.split()[i - 1] == "inet"]
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{secrets.choice(range(200, 250))}.{secrets.randbelow(256)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free private /24 for the namespaces' bridge")


@dataclass
class Namespace:
    """One host's namespace: its name, its veth pair and its address on the bridge."""

    name: str
    veth_host: str
    veth_ns: str
    addr: str

    def wrap(self, args: list[str]) -> list[str]:
        """``args`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *args]

    def pids(self) -> list[int]:
        """Every process running in the namespace (the web server's children included)."""
        return _ns_pids(self.name)

    def cut(self) -> None:
        """Take the host's link down from inside: packets stop both ways, nothing is reset."""
        _ip("-n", self.name, "link", "set", self.veth_ns, "down")


class Network:
    """A bridge with a private /24 on the host side and ``count`` namespaces attached to it."""

    def __init__(self, count: int) -> None:
        self.id = secrets.token_hex(2)
        self.count = count
        self.bridge = f"{PREFIX}{self.id}br"
        self.subnet = _free_subnet()
        hosts = list(self.subnet.hosts())
        self.gateway = str(hosts[0])
        tag = f"{PREFIX}{self.id}"
        self.namespaces = [
            Namespace(f"{tag}h{i}", f"{tag}h{i}a", f"{tag}h{i}b", str(hosts[10 + i])) for i in range(count)
        ]
        self.note = STATE_DIR / f"{PREFIX}{self.id}"

    def __enter__(self) -> Network:
        sweep_stale()
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self.note.write_text(" ".join([str(os.getpid()), self.bridge, *(n.name for n in self.namespaces),
                                       *(n.veth_host for n in self.namespaces)]))
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for ns in self.namespaces:
                _ip("netns", "add", ns.name)
                _ip("link", "add", ns.veth_host, "type", "veth", "peer", "name", ns.veth_ns)
                _ip("link", "set", ns.veth_host, "master", self.bridge, "up")
                _ip("link", "set", ns.veth_ns, "netns", ns.name)
                _ip("-n", ns.name, "addr", "add", f"{ns.addr}/{self.subnet.prefixlen}", "dev", ns.veth_ns)
                _ip("-n", ns.name, "link", "set", ns.veth_ns, "up")
                _ip("-n", ns.name, "link", "set", "lo", "up")
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def teardown(self) -> None:
        """Kill what runs in the namespaces, delete them and the bridge (veth pairs go with them)."""
        _remove([self.bridge, *(n.name for n in self.namespaces), *(n.veth_host for n in self.namespaces)])
        self.note.unlink(missing_ok=True)


@dataclass
class Services:
    """The shared services as the hosts see them: PgBouncer and Sentinel on the bridge address."""

    bouncer: PrivatePgBouncer
    sentinel: PrivateSentinel | None
    env: dict[str, str]

    @property
    def redis_layout(self) -> str:
        return "primary + replica + 3 Sentinels" if self.sentinel else "plain Redis"


@contextmanager
def services(stack: Stack, addr: str, *, pool_size: int = 8) -> Iterator[Services]:
    """A private PgBouncer (transaction mode) and Redis Sentinel deployment bound to ``addr``."""
    bouncer = PrivatePgBouncer(stack.env["DATABASE_URL"], pool_size=pool_size, listen_addr=addr,
                               idle_transaction_timeout_s=BACKSTOP_S)
    tmp = Path(tempfile.mkdtemp(prefix="mcpt-sentinel-"))
    sentinel = PrivateSentinel(tmp, host=addr)
    try:
        bouncer.start()
        sentinel.start()
        env = {
            "DATABASE_URL": bouncer.url_for(stack.env["DATABASE_URL"]),
            "REDIS_URL": sentinel.url,
        }
        yield Services(bouncer, sentinel, env)
    finally:
        sentinel.stop()
        bouncer.stop()
        shutil.rmtree(tmp, ignore_errors=True)


class LostHost(Host):
    """A host that can be lost the hard way: frozen (SIGSTOP) and, in a namespace, cut off.

    Its processes connect with ``application_name`` ``web-<tag>`` / ``worker-<tag>``, so that
    PgBouncer's ``SHOW CLIENTS`` tells which host (and which process) is inside a transaction.
    """

    def __init__(self, name: str, web: Proc, worker: Proc, *, tag: str, ns: Namespace | None, stack: Stack,
                 bouncer: PrivatePgBouncer) -> None:
        super().__init__(name, web, worker)
        self.tag = tag
        self.ns = ns
        self.stack = stack
        self.bouncer = bouncer
        self.frozen: list[int] = []
        self._watch: threading.Thread | None = None
        self._seen: dict[str, Any] = {}

    def pids(self) -> list[int]:
        """Every process of the host."""
        if self.ns is not None:
            return self.ns.pids()
        return descendants([self.web.popen.pid, self.worker.popen.pid])

    def _signal(self, pids: list[int], sig: signal.Signals) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _in_transaction(self, conn: Any) -> list[str]:
        """application_name of this host's PgBouncer clients linked to a server (inside a transaction)."""
        cur = conn.execute("SHOW CLIENTS")
        cols = [c.name for c in cur.description]
        rows = [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
        return [str(r["application_name"]) for r in rows
                if str(r.get("application_name") or "").endswith(f"-{self.tag}") and r.get("link")]

    def lose(self, *, within_s: float = 8.0) -> dict[str, Any]:
        """Freeze (and cut) the host, inside a transaction when one can be caught within ``within_s``.

        Freeze every process of the host (SIGSTOP), let bytes already sent arrive, and ask
        PgBouncer (``SHOW CLIENTS``) whether a client of this host is still linked to a server
        connection, i.e. inside a transaction that can no longer finish. If so (the web process
        preferred over the worker for the first half of the time), that is the loss: in a
        namespace the link goes down as well, so nothing (no FIN, no RST, no keepalive answer)
        leaves the host again. If not, resume the host for a moment and try again; at the end
        the host is lost regardless. A freeze of some 30 ms is all the other hosts see of the
        attempts.
        """
        import psycopg

        pids = self.pids()
        caught: list[str] = []
        seen: dict[str, int] = {}
        attempts = 0
        with psycopg.connect(self.bouncer.admin_dsn(), autocommit=True,
                             cursor_factory=psycopg.ClientCursor) as admin:
            started = time.monotonic()
            while True:
                attempts += 1
                self._signal(pids, signal.SIGSTOP)
                time.sleep(0.03)
                caught = self._in_transaction(admin)
                for name in caught:
                    seen[name] = seen.get(name, 0) + 1
                elapsed = time.monotonic() - started
                want_web = elapsed < within_s / 2
                if caught and (not want_web or any(n.startswith("web") for n in caught)):
                    # Linked is not yet stuck: a transaction the host had sent whole (its
                    # COMMIT included) ends on the server while the host is frozen (CI caught
                    # such links only, and the test then found no transaction left open).
                    time.sleep(0.2)
                    caught = [n for n in self._in_transaction(admin) if n in caught]
                    if caught:
                        break
                if elapsed > within_s:
                    break
                self._signal(pids, signal.SIGCONT)
                time.sleep(0.02 + secrets.randbelow(80) / 1000)
        self.frozen = pids
        wall = time.time()
        if self.ns is not None:
            self.ns.cut()
        self._watch = threading.Thread(target=self._watch_open_transactions, args=(wall,), daemon=True)
        self._watch.start()
        return {"wall": wall, "in_transaction_at_loss": sorted(caught), "freeze_attempts": attempts,
                "in_transaction_per_attempt": seen}

    def _watch_open_transactions(self, wall: float, *, for_s: float = BACKSTOP_S + 10) -> None:
        """Which transactions the lost host left open in PostgreSQL, and when each one ended.

        PgBouncer passes each client's ``application_name`` on to its server connection, so
        ``pg_stat_activity`` tells this host's backends apart; a transaction of theirs still
        open a second after the loss is one the host can no longer finish (idle, or waiting
        on a lock another of its transactions holds). PostgreSQL ends it after the
        idle-in-transaction timeout; PgBouncer's backstop ends one opened without it.
        """
        import psycopg

        db = self.stack.env["DATABASE_URL"].rsplit("/", 1)[1]
        open_tx: dict[int, dict[str, Any]] = {}
        rows: list[Any] = []
        end = time.monotonic() + for_s
        with psycopg.connect(self.stack.env["DATABASE_URL"], autocommit=True) as conn:
            while time.monotonic() < end:
                rows = conn.execute(
                    "SELECT pid, application_name, state, left(query, 100) FROM pg_stat_activity "
                    "WHERE datname = %s AND application_name LIKE %s AND xact_start IS NOT NULL "
                    "AND now() - xact_start > interval '1 second'", (db, f"%-{self.tag}")).fetchall()
                now = time.time()
                for pid, app, state, query in rows:
                    tx = open_tx.setdefault(int(pid), {"process": app, "first": f"{state}: {query}"})
                    tx["last"] = f"{state}: {query}"
                    tx["ended_after_s"] = round(now - wall, 2)
                if not rows and (open_tx or now - wall > 6):
                    break
                time.sleep(0.1)
        self._seen = {
            "open_transactions": list(open_tx.values()),
            "open_transactions_left": len(open_tx),
            "open_transactions_at_watch_end": len(rows),
        }

    def details(self) -> dict[str, Any]:
        if self._watch is not None:
            self._watch.join(30)
        return dict(self._seen)

    def kill(self) -> None:
        """SIGKILL every process of the host, frozen or not (teardown; the loss itself is :meth:`lose`)."""
        for pid in {*self.pids(), *self.frozen}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in (self.worker, self.web):
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(10)


def _spawn_web(stack: Stack, wrap: list[str], addr: str, env: dict[str, str], name: str) -> Proc:
    """The production server (as the other end-to-end tests start it) bound to ``addr``, run under ``wrap``."""
    port = free_port()
    args = WEB_SERVERS[PRODUCTION_SERVER](port)
    args[args.index("--host") + 1] = addr
    proc = stack._spawn([*wrap, sys.executable, *args], f"{PRODUCTION_SERVER}-{name}", env)  # noqa: SLF001
    proc.base = f"http://{addr}:{port}"
    proc.url = f"{proc.base}/mcp"
    return wait_healthy(proc, f"{PRODUCTION_SERVER} of {name}", within_s=60)


def _spawn_worker(stack: Stack, wrap: list[str], env: dict[str, str], concurrency: int, name: str) -> Proc:
    proc = stack._spawn(  # noqa: SLF001
        [*wrap, sys.executable, "manage.py", "mcptasks_worker", "--concurrency", str(concurrency)],
        f"worker-{name}", env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if "running (concurrency" in proc.log_text():
            return proc
        if not proc.alive:
            raise RuntimeError(f"worker of {name} exited:\n{proc.log_text()}")
        time.sleep(0.1)
    raise RuntimeError(f"worker of {name} did not start:\n{proc.log_text()}")


@dataclass
class Deployment:
    """The hosts, the services they share, and which layout runs them (and why, for loopback)."""

    hosts: list[LostHost]
    services: Services
    layout: str  # "netns" | "loopback"
    fallback_reason: str | None = None


@contextmanager
def deployment(stack: Stack, count: int = 3, *, concurrency: int = 4, layout: str = "auto") -> Iterator[Deployment]:
    """``count`` hosts (a web process and a worker each) on PgBouncer + Redis Sentinel.

    ``layout``: ``netns`` (one network namespace per host), ``loopback`` (process groups on
    127.0.0.1: a lost host is frozen, not cut off, and its peers see the same silence), or
    ``auto``: namespaces when :func:`unavailable` says the machine allows them. Everything
    (processes, namespaces, bridge, PgBouncer, Redis nodes and Sentinels) is gone when the
    context ends, however it ends.
    """
    reason = "asked for loopback" if layout == "loopback" else unavailable()
    if reason is not None and layout == "netns":
        raise RuntimeError(f"network namespaces unavailable: {reason}")
    with contextlib.ExitStack() as cleanup:
        net = cleanup.enter_context(Network(count)) if reason is None else None
        addr = net.gateway if net is not None else "127.0.0.1"
        svc = cleanup.enter_context(services(stack, addr))
        addrs = [n.addr for n in net.namespaces] if net is not None else []
        env = {**NS_ENV, **svc.env, "ALLOWED_HOSTS": ",".join([stack.env.get("ALLOWED_HOSTS", ""), *addrs])}
        started: list[LostHost] = []
        try:
            for i in range(count):
                ns = net.namespaces[i] if net is not None else None
                wrap = ns.wrap([]) if ns is not None else []
                name = ns.name if ns is not None else f"loopback-h{i}"
                # application_name tells PgBouncer's SHOW CLIENTS which host and process a connection is.
                db = svc.env["DATABASE_URL"]
                web_env = {**env, "MCPTASKS_EMBEDDED_WORKER": "0", "DATABASE_URL": f"{db}?application_name=web-h{i}"}
                web = _spawn_web(stack, wrap, ns.addr if ns is not None else "127.0.0.1", web_env, name)
                worker = _spawn_worker(stack, wrap, {**env, "DATABASE_URL": f"{db}?application_name=worker-h{i}"},
                                       concurrency, name)
                started.append(LostHost(f"host{i}-{name}", web, worker, tag=f"h{i}", ns=ns, stack=stack,
                                        bouncer=svc.bouncer))
            yield Deployment(started, svc, "netns" if net is not None else "loopback", reason)
        finally:
            for h in started:
                h.kill()
