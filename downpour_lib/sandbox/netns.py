"""Separate hosts on one Linux machine: network namespaces on a private bridge, with rate shaping.

The ground the multi-node Slurm sandbox stands on. ``Network(tag).up(n)`` creates a bridge in the
root namespace holding the controller's address (``10.213.0.1``) and ``n`` namespaces, each joined
to the bridge by a veth pair whose inner end is the node's ``eth0`` with its own address
(``10.213.0.11``, ``.12``, ...). Only these links carry the addresses; nothing else of the machine
is touched. ``shape(rate)`` puts a token bucket (``tc ... tbf``) on both ends of every node's link,
so each node sends and receives at ``rate`` (``netem`` delay is not needed: bandwidth is what a
cluster's network limits), and every node's TCP a loss-based congestion control whatever the host's
(``CONGESTION_CONTROL``). ``down`` removes every namespace, link and qdisc it made; both ``up``
and ``down`` are idempotent. Needs root and ``ip netns``.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from ..errors import ConfigError, DownpourError

SUBNET = "10.213.0"
CONTROLLER = f"{SUBNET}.1"
RATE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$")
UNITS = {None: 1, "k": 10**3, "m": 10**6, "g": 10**9}
#: the TCP congestion control of the nodes, the first of these a namespace may choose (the host's
#: net.ipv4.tcp_allowed_congestion_control; reno always is). A new namespace inherits the host's,
#: BBR on the machine this was built on, and BBR with both directions of a shaped link busy at once
#: (SGP's peers each send 1.6 MB) paced those steps 8-25% slower at 100mbit than allreduce moving
#: the same bytes, by a different amount each run (172, 169, 178, 154 ms against 142); reno ran
#: both within 1% of each other and of the performance model. cubic is Linux's own default
CONGESTION_CONTROL = ("cubic", "reno")


class NetworkError(DownpourError):
    """The namespaces or links cannot be made here (not root, no ``ip netns``), or a command failed."""


def parse_rate(rate: str) -> int:
    """``100mbit`` -> bits per second (tc's units: kbit, mbit, gbit, powers of 1000)."""
    m = RATE.match(str(rate).strip().lower())
    if not m or float(m[1]) <= 0:
        raise ConfigError("bandwidth", rate, "give a rate such as 100mbit, 1gbit or 10gbit "
                                             "(or none for an unshaped link)")
    return int(float(m[1]) * UNITS[m[2]])


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetworkError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()}")
    return proc


@dataclass(frozen=True)
class Node:
    index: int
    namespace: str
    address: str
    veth: str  # the host end; the node's end is eth0

    def command(self, *cmd: str) -> list[str]:
        """``cmd`` run inside this node's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *cmd]


class Network:
    """The bridge and namespaces of one sandbox, named after ``tag`` (a few letters or digits), so
    that two sandboxes never share a link."""

    def __init__(self, tag: str) -> None:
        if not re.fullmatch(r"[a-z0-9]{1,6}", tag):
            raise ConfigError("tag", tag, "use 1 to 6 lowercase letters or digits")
        self.tag = tag
        self.bridge = f"dp{tag}br"  # interface names have at most 15 characters

    def node(self, index: int) -> Node:
        return Node(index, f"dp{self.tag}n{index}", f"{SUBNET}.{11 + index}", f"dp{self.tag}v{index}")

    def nodes(self) -> list[Node]:
        """The nodes that exist now, in order."""
        out = _run("ip", "netns", "list").stdout
        names = {line.split()[0] for line in out.splitlines() if line.strip()}
        found = []
        index = 0
        while self.node(index).namespace in names:
            found.append(self.node(index))
            index += 1
        return found

    @staticmethod
    def check() -> None:
        """Refuse, with the reason, where namespaces cannot be made."""
        if hasattr(os, "geteuid") and os.geteuid() != 0:
            raise NetworkError("network namespaces need root (run as root, or use one node)")
        if shutil.which("ip") is None or shutil.which("tc") is None:
            raise NetworkError("`ip` and `tc` are needed (apt-get install iproute2)")
        if shutil.which("sysctl") is None:
            raise NetworkError("`sysctl` is needed to set the nodes' TCP (apt-get install procps)")
        if _run("ip", "netns", "list", check=False).returncode != 0:
            raise NetworkError("this kernel or container does not allow `ip netns`")

    def up(self, count: int) -> list[Node]:
        """``count`` nodes on the bridge (those already there are kept)."""
        self.check()
        for line in _run("ip", "-4", "-o", "addr", "show").stdout.splitlines():
            dev, addr = line.split()[1], line.split()[3]
            if addr.startswith(f"{SUBNET}.") and dev != self.bridge:
                raise NetworkError(f"the sandbox's subnet {SUBNET}.0/24 is already in use here, by "
                                   f"{dev} ({addr}): another sandbox's nodes? Take that one down "
                                   "first (downpour sandbox slurm down --dir ITS_DIR)")
        if _run("ip", "link", "show", self.bridge, check=False).returncode != 0:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{CONTROLLER}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for index in range(count):
            node = self.node(index)
            if node in self.nodes():
                continue
            _run("ip", "netns", "add", node.namespace)
            _run("ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0",
                 "netns", node.namespace)
            _run("ip", "link", "set", node.veth, "master", self.bridge, "up")
            _run(*node.command("ip", "addr", "add", f"{node.address}/24", "dev", "eth0"))
            _run(*node.command("ip", "link", "set", "eth0", "up"))
            _run(*node.command("ip", "link", "set", "lo", "up"))
        self._set_tcp()
        return self.nodes()

    def _set_tcp(self) -> None:
        control = self.congestion_control()
        for node in self.nodes():
            _run(*node.command("sysctl", "-qw", f"net.ipv4.tcp_congestion_control={control}"))

    @staticmethod
    def congestion_control() -> str:
        """The first of ``CONGESTION_CONTROL`` a namespace may use here."""
        with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
            allowed = f.read().split()
        return next((name for name in CONGESTION_CONTROL if name in allowed), "reno")

    def tcp(self, node: Node) -> str:
        """The congestion control the node's new connections use."""
        proc = _run(*node.command("sysctl", "-n", "net.ipv4.tcp_congestion_control"), check=False)
        return proc.stdout.strip() if proc.returncode == 0 else "?"

    def shape(self, rate: str | None) -> None:
        """Every node's link at ``rate`` in both directions; None or "none": unshaped."""
        bits = None if rate in (None, "none") else parse_rate(rate)
        self._set_tcp()  # a sandbox made before CONGESTION_CONTROL too
        for node in self.nodes():
            for cmd in (["tc"], node.command("tc")):
                dev = node.veth if len(cmd) == 1 else "eth0"
                if bits is None:
                    _run(*cmd, "qdisc", "del", "dev", dev, "root", check=False)
                    continue
                # the bucket holds 4 ms of traffic (at least 64 KB): enough for a TCP window's
                # bursts at this rate without letting a burst pass unshaped
                burst = max(64 * 1024, bits // 8 // 250)
                _run(*cmd, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", str(bits),
                     "burst", str(burst), "latency", "100ms")

    def shaping(self, node: Node) -> str:
        """The node's link rate as tc reports it, or "none"."""
        out = _run("tc", "qdisc", "show", "dev", node.veth, check=False).stdout
        m = re.search(r"tbf .*?rate (\S+)", out)
        return m[1] if m else "none"

    def losses(self) -> dict[str, int]:
        """What the nodes' links have lost since they were made, summed over the nodes: packets the
        token buckets dropped (``drops``, both ends of each link), TCP's retransmission timeouts
        (``rtos``: each a stall of 200 ms or more, longer than a whole step at these rates) and
        retransmitted segments (``retransmits``, most of them tail-loss probes)."""
        total = {"drops": 0, "rtos": 0, "retransmits": 0}
        for node in self.nodes():
            for cmd in (["tc", "-s", "qdisc", "show", "dev", node.veth],
                        node.command("tc", "-s", "qdisc", "show", "dev", "eth0")):
                out = _run(*cmd, check=False).stdout
                total["drops"] += sum(int(n) for n in re.findall(r"dropped (\d+)", out))
            counters = _tcp_counters(_run(*node.command("cat", "/proc/net/snmp", "/proc/net/netstat"),
                                          check=False).stdout)
            total["rtos"] += counters.get("TcpExt.TCPTimeouts", 0)
            total["retransmits"] += counters.get("Tcp.RetransSegs", 0)
        return total

    def exists(self) -> bool:
        """Whether the bridge is there."""
        return _run("ip", "link", "show", self.bridge, check=False).returncode == 0

    def down(self) -> None:
        """Remove every namespace and link of this network (their qdiscs go with them)."""
        for node in self.nodes():
            _run("ip", "link", "del", node.veth, check=False)  # its peer, eth0, goes with it
            _run("ip", "netns", "del", node.namespace, check=False)
        if _run("ip", "link", "show", self.bridge, check=False).returncode == 0:
            _run("ip", "link", "del", self.bridge)


def _tcp_counters(text: str) -> dict[str, int]:
    """``/proc/net/snmp`` and ``/proc/net/netstat`` as "Group.Name" -> value: each group is a line
    of names followed by a line of values, both headed "Group:"."""
    counters: dict[str, int] = {}
    lines = [line.split() for line in text.splitlines() if ":" in line]
    for names, values in itertools.pairwise(lines):
        if names[0] != values[0] or not values[1].lstrip("-").isdigit():
            continue
        group = names[0].rstrip(":")
        counters.update({f"{group}.{n}": int(v) for n, v in zip(names[1:], values[1:], strict=False)
                         if v.lstrip("-").isdigit()})
    return counters
