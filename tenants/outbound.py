"""The outbound-address policy: where this service's own HTTP requests may go.

Every URL the service fetches because someone configured it (an issuer's JWKS URL today; webhook
deliveries later) goes through :func:`build_opener`. Destinations are checked on the *resolved*
address, inside the connection: the host name is resolved once, every address is checked, and
the socket connects to exactly the addresses that were checked. A name that resolves to a
public address when validated and to ``127.0.0.1`` a moment later (DNS rebinding) is therefore
refused too. Refused: loopback, private, link-local (cloud metadata at ``169.254.169.254``),
shared (``100.64.0.0/10``), reserved, unspecified and multicast addresses, IPv4-mapped IPv6
forms of them included; that is, everything that is not a global unicast address. An operator
allows specific networks with ``MCPTASKS_OUTBOUND_ALLOWED_NETWORKS`` (CIDRs, empty by default).
Environment proxies are not used (the proxy's address would be the one checked).
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import logging
import socket
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from tenants import conf

logger = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class OutboundRefused(OSError):
    """The destination address is not allowed by the outbound policy."""


@functools.lru_cache(maxsize=8)
def _parse_networks(values: tuple[str, ...]) -> tuple[Network, ...]:
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            # Reported by the system check tenants.E004; never widens the policy.
            logger.warning("MCPTASKS_OUTBOUND_ALLOWED_NETWORKS: %r is not a network, ignored", value[:100])
    return tuple(networks)


def invalid_networks(values: tuple[str, ...]) -> list[str]:
    """The entries of ``values`` that are not CIDRs (for the system check)."""
    bad = []
    for value in values:
        try:
            ipaddress.ip_network(value.strip(), strict=False)
        except ValueError:
            bad.append(value)
    return bad


def allowed_networks() -> tuple[Network, ...]:
    """The networks the operator allows beyond global unicast addresses."""
    return _parse_networks(tuple(conf.get().OUTBOUND_ALLOWED_NETWORKS))


def is_allowed(address: str | Address) -> bool:
    """Whether the service may connect to ``address`` (an IP address, never a name)."""
    try:
        ip = ipaddress.ip_address(str(address).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip.version == net.version and ip in net for net in allowed_networks()):
        return True
    return ip.is_global and not ip.is_multicast


def literal_host_refused(url: str) -> bool:
    """Whether ``url`` names a host that is refused without resolving anything.

    For validating a URL when it is saved: an IP literal outside the policy, or ``localhost``.
    Names are checked again (resolved) at every connection.
    """
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return not is_allowed("127.0.0.1")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return not is_allowed(host)


def create_connection(address: tuple[str, int], timeout: Any = socket._GLOBAL_DEFAULT_TIMEOUT,  # type: ignore[attr-defined]
                      source_address: Any = None) -> socket.socket:
    """Like :func:`socket.create_connection`, but only to checked addresses (resolved once)."""
    host, port = address
    infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    if not infos:
        raise OutboundRefused("destination did not resolve")
    for info in infos:
        if not is_allowed(str(info[4][0])):
            raise OutboundRefused("destination address not allowed by the outbound policy")
    error: OSError | None = None
    for family, kind, proto, _canon, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            if timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:  # type: ignore[attr-defined]
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)  # the address just checked, not a new lookup
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    raise error or OutboundRefused("no address to connect to")


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = create_connection


class _HTTPSConnection(http.client.HTTPSConnection):
    # TLS is still verified against the host name (server_hostname), not the address.
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = create_connection


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: Any) -> Any:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: Any) -> Any:
        return self.do_open(_HTTPSConnection, req, context=getattr(self, "_context", None))


def build_opener(*handlers: Any, on_connect: Callable[[socket.socket], None] | None = None
                 ) -> urllib.request.OpenerDirector:
    """A ``urllib`` opener whose every connection obeys the outbound policy (no env proxies).

    ``on_connect`` is given each connected socket (before TLS): a caller that needs a deadline
    on the whole request (socket timeouts bound each read, not a receiver that trickles bytes)
    shuts the socket down when it passes.
    """
    if on_connect is None:
        return urllib.request.build_opener(urllib.request.ProxyHandler({}), _HTTPHandler, _HTTPSHandler, *handlers)
    hook = on_connect

    def connect(address: tuple[str, int], timeout: Any = socket._GLOBAL_DEFAULT_TIMEOUT,  # type: ignore[attr-defined]
                source_address: Any = None) -> socket.socket:
        sock = create_connection(address, timeout, source_address)
        hook(sock)
        return sock

    class Connection(_HTTPConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._create_connection = connect

    class TLSConnection(_HTTPSConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._create_connection = connect

    class Handler(urllib.request.HTTPHandler):
        def http_open(self, req: Any) -> Any:
            return self.do_open(Connection, req)

    class TLSHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: Any) -> Any:
            return self.do_open(TLSConnection, req, context=getattr(self, "_context", None))

    return urllib.request.build_opener(urllib.request.ProxyHandler({}), Handler, TLSHandler, *handlers)
