"""Which address of rank 0's host the other ranks reach it at, for the rendezvous store.

A host name is not an answer on several nodes: Debian and Ubuntu map the machine's own name to
127.0.1.1 in /etc/hosts, so ``gethostbyname(getfqdn())`` hands the other nodes a loopback
address, and a node with several interfaces (management Ethernet, InfiniBand, a container bridge)
has one name but several addresses, of which some are not routed between the nodes. So rank 0
offers every IPv4 address of its interfaces that are up, best first, and each rank takes the
first one it can open a connection to (``reachable``). ``DOWNPOUR_SOCKET_IFNAME`` narrows the
offer to named interfaces, as ``NCCL_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME`` do for those
libraries: a comma list of names or prefixes (``ib`` takes ib0 and ib1), ``^`` in front excludes
them instead. ``MASTER_ADDR``, when set, wins over all of it.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterable, Mapping, Sequence

import psutil

IFNAME_VARIABLE = "DOWNPOUR_SOCKET_IFNAME"

#: Interfaces that exist on a host but rarely carry traffic between nodes: offered last.
UNLIKELY = ("docker", "virbr", "veth", "br-", "lxc", "cni", "flannel", "cali", "tun", "tap")


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p) for p in patterns)


def select(interfaces: Mapping[str, Iterable[str]], up: Iterable[str], ifname: str | None) -> list[str]:
    """The addresses to offer, best first, from ``interfaces`` (name -> its IPv4 addresses), of
    which those named in ``up`` are up. A pure function (the tests give it made-up hosts).

    Loopback addresses are left out, and so are link-local ones (169.254/16); interfaces that
    usually do not connect nodes (``UNLIKELY``) come last; ``ifname`` (see the module docstring)
    keeps or drops interfaces by name."""
    up = set(up)
    patterns = [p.strip() for p in (ifname or "").lstrip("^").split(",") if p.strip()]
    exclude = bool(ifname) and ifname.startswith("^")
    chosen: list[tuple[bool, str]] = []
    for name, addrs in interfaces.items():
        if name not in up:
            continue
        if patterns and _matches(name, patterns) == exclude:
            continue
        for addr in addrs:
            ip = ipaddress.ip_address(addr)
            if ip.is_loopback or ip.is_link_local:
                continue
            chosen.append((_matches(name, UNLIKELY), addr))
    ordered = [addr for _, addr in sorted(chosen, key=lambda c: c[0])]  # stable: the host's order
    return list(dict.fromkeys(ordered))


def host_addresses(ifname: str | None = None) -> list[str]:
    """This host's IPv4 addresses another node may reach it at, best first (see ``select``)."""
    interfaces = {name: [a.address for a in addrs if a.family == socket.AF_INET]
                  for name, addrs in psutil.net_if_addrs().items()}
    up = [name for name, stats in psutil.net_if_stats().items() if stats.isup]
    return select(interfaces, up, ifname)


def interface_names() -> list[str]:
    """The names of this host's interfaces that are up."""
    return sorted(name for name, stats in psutil.net_if_stats().items() if stats.isup)


def reachable(addresses: Sequence[str], port: int, timeout_s: float = 3.0) -> str | None:
    """The first of ``addresses`` that accepts a TCP connection on ``port``, trying each in turn
    until ``timeout_s`` has passed (a listener may be a moment late); None if none does."""
    deadline = time.monotonic() + timeout_s
    while True:
        for addr in addresses:
            try:
                with socket.create_connection((addr, port), timeout=min(1.0, timeout_s)):
                    return addr
            except OSError:
                continue
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)
