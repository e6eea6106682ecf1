"""Separate hosts on one machine (sandbox/netns.py): namespaces that reach each other over the
sandbox's bridge only, at the rate they are shaped to, and nothing left behind. As root."""

import os
import subprocess
import sys

import pytest

from downpour_lib.errors import ConfigError
from downpour_lib.sandbox.netns import Network, NetworkError, parse_rate

MB = 2**20

# Reads SIZE bytes from the first connection and prints how long they took to arrive.
SERVER = """
import socket, sys, time
s = socket.create_server((sys.argv[1], 5999))
print("listening", flush=True)
c, _ = s.accept()
size, got, start = int(sys.argv[2]), 0, None
while got < size:
    b = c.recv(1 << 20)
    if not b:
        break
    start = start or time.perf_counter()
    got += len(b)
print(got, time.perf_counter() - start, flush=True)
"""
CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], 5999), timeout=30)
c.sendall(bytes(int(sys.argv[2])))
c.close()
"""


def usable() -> str | None:
    try:
        Network.check()
    except NetworkError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(usable() is not None and not os.environ.get("DOWNPOUR_REQUIRE_SLURM"),
                                reason=str(usable()))


@pytest.fixture
def network():
    net = Network("tst")
    net.down()  # whatever an interrupted run left
    try:
        yield net
    finally:
        net.down()


def transfer_rate(a, b, size: int) -> float:
    """Bytes per second from node ``a`` to node ``b``, measured at the receiver."""
    server = subprocess.Popen(b.command(sys.executable, "-c", SERVER, b.address, str(size)),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        subprocess.run(a.command(sys.executable, "-c", CLIENT, b.address, str(size)), check=True,
                       timeout=60)
        got, seconds = server.stdout.readline().split()
    finally:
        server.kill()
        server.wait()
    assert int(got) == size
    return size / float(seconds)


def test_nodes_reach_each_other_and_run_at_the_shaped_rate(network):
    a, b = network.up(2)
    assert (a.address, b.address) == ("10.213.0.11", "10.213.0.12")
    assert network.up(2) == [a, b]  # idempotent
    unshaped = transfer_rate(a, b, 64 * MB)
    network.shape("100mbit")
    assert network.shaping(a) == network.shaping(b) == "100Mbit"
    shaped = transfer_rate(a, b, 16 * MB)
    reverse = transfer_rate(b, a, 16 * MB)  # both directions are shaped
    line = 100e6 / 8
    for rate in (shaped, reverse):
        assert 0.75 * line <= rate <= 1.25 * line, f"{rate / 1e6:.1f} MB/s at 100mbit"
    assert unshaped > 5 * line, f"unshaped only {unshaped / 1e6:.1f} MB/s"
    network.shape("none")  # changeable on a running network
    assert network.shaping(a) == "none"
    print(f"unshaped {unshaped / 1e6:.0f} MB/s, 100mbit {shaped / 1e6:.1f} / {reverse / 1e6:.1f} MB/s")


def test_down_leaves_no_namespace_or_link_and_is_idempotent(network):
    network.up(2)
    network.down()
    network.down()
    assert "dptstn" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "dptst" not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout


def test_bad_rates_are_refused_with_what_would_work():
    assert parse_rate("100mbit") == 100_000_000 and parse_rate("1gbit") == 10**9
    for bad in ("fast", "100mb", "0gbit", "-1mbit"):
        with pytest.raises(ConfigError, match=f"bandwidth={bad!r} .*100mbit, 1gbit or 10gbit"):
            parse_rate(bad)
    with pytest.raises(ConfigError, match="tag"):
        Network("Bad Tag")


FLOOD = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[2])):
    try:
        s.sendto(bytes(1400), (sys.argv[1], 5998))
    except OSError:  # ENOBUFS: the bucket's queue is full, the datagram dropped
        pass
"""


def test_losses_count_what_the_shaped_links_drop(network):
    """`model validate` reports each sitting's losses. A sender's own bucket holds its socket back
    instead of dropping, so the bottleneck is made downstream: `a` unshaped, and 7 MB of UDP sent
    at once into `b`'s 10mbit end (a queue of 100 ms, 125 KB) is mostly dropped there, which
    `losses` counts; TCP's counters are read from the nodes' namespaces, not the host's."""
    a, b = network.up(2)
    network.shape("10mbit")
    subprocess.run(a.command("tc", "qdisc", "del", "dev", "eth0", "root"), check=True)
    before = network.losses()
    assert set(before) == {"drops", "rtos", "retransmits"}
    subprocess.run(a.command(sys.executable, "-c", FLOOD, b.address, "5000"), check=True, timeout=60)
    after = network.losses()
    assert after["drops"] - before["drops"] > 2500, (before, after)
    assert after["rtos"] == before["rtos"] and after["retransmits"] == before["retransmits"] == 0
