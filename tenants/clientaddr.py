"""The client address of a request: the one function every address-based decision uses.

The sign-in throttle, the authentication-failure audit and its ``flag.auth_failures``, and the
``/metrics`` loopback rule all key on the client's address. Behind a reverse proxy the direct
peer is the proxy (often loopback), so using it would make every client one client: one sign-in
budget for all, and ``/metrics`` open to the internet through a same-host proxy.

``X-Forwarded-For`` is honoured only when the direct peer is a trusted proxy
(``MCPTASKS_TRUSTED_PROXIES``, a list of CIDRs); then the hops are read from the right and the
first one that is not a trusted proxy is the client (the hops to its left were written by the
client itself and prove nothing). The result is always a parsed, normalised address or
``"unknown"``, never a client string.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from typing import Any

from tenants import conf

#: Hops read from ``X-Forwarded-For`` at most (a longer header is cut from the left: those hops
#: would be client-written anyway), and characters of the header looked at.
MAX_HOPS = 32
_MAX_HEADER_CHARS = 2048

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(entries: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDRs (or single addresses) as networks; raises ``ValueError`` on a malformed entry."""
    return tuple(ipaddress.ip_network(e.strip(), strict=False) for e in entries if e.strip())


@functools.lru_cache(maxsize=8)
def _trusted(entries: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    try:
        return parse_networks(entries)
    except ValueError:
        # A malformed list trusts nobody (system check tenants.E005 reports it).
        return ()


def _parse(value: str) -> IPAddress | None:
    value = value.strip()
    if value.startswith("[") and "]" in value:  # "[v6]:port"
        value = value[1:value.index("]")]
    elif value.count(":") == 1:  # "v4:port"
        value = value.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def client_address(peer: str | None, forwarded_for: Iterable[str] = ()) -> str:
    """The client's address from the direct ``peer`` and the ``X-Forwarded-For`` header values.

    ``"unknown"`` when the peer is missing or malformed.
    """
    ip = _parse(str(peer or ""))
    if ip is None:
        return "unknown"
    trusted = _trusted(tuple(conf.get().TRUSTED_PROXIES))
    if not trusted or not _is_trusted(ip, trusted):
        return str(ip)
    header = ",".join(forwarded_for)[-_MAX_HEADER_CHARS:]
    hops = [h for h in header.split(",") if h.strip()][-MAX_HOPS:]
    for hop in reversed(hops):
        parsed = _parse(hop)
        if parsed is None:
            break  # a hop we cannot read: trust nothing to its left
        ip = parsed
        if not _is_trusted(ip, trusted):
            return str(ip)
    # Every readable hop was a trusted proxy: the leftmost of them is the nearest we know.
    return str(ip)


def _is_trusted(ip: IPAddress, trusted: tuple[IPNetwork, ...]) -> bool:
    return any(ip.version == net.version and ip in net for net in trusted)


def from_request(request: Any) -> str:
    """The client address of a Django request."""
    meta = request.META
    forwarded = meta.get("HTTP_X_FORWARDED_FOR")
    return client_address(str(meta.get("REMOTE_ADDR") or ""), [str(forwarded)] if forwarded else [])


def from_scope(scope: dict[str, Any]) -> str:
    """The client address of an ASGI scope."""
    client = scope.get("client") or ("", 0)
    forwarded = [v.decode("latin-1") for k, v in scope.get("headers") or () if k.lower() == b"x-forwarded-for"]
    return client_address(str(client[0]) if client else "", forwarded)
