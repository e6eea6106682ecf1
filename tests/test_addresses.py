"""The rendezvous address across hosts (comm/addresses.py): what rank 0 offers, what a rank takes."""

import datetime
import re
import socket

import torch.distributed as dist
from conftest import explain, mpi_python

from downpour_lib.comm.addresses import host_addresses, reachable, select

# A compute node as Slurm sites have them: loopback, a management NIC, InfiniBand, a docker
# bridge, a link-local address; one interface down.
NODE = {"lo": ["127.0.0.1"], "eno1": ["192.168.10.7", "169.254.3.3"], "ib0": ["10.20.0.7"],
        "docker0": ["172.17.0.1"], "ib1": ["10.21.0.7"]}
UP = ["lo", "docker0", "eno1", "ib0"]  # ib1 is down


def test_loopback_link_local_and_down_interfaces_are_never_offered_and_bridges_come_last():
    offer = select(NODE, UP, None)
    assert offer == ["192.168.10.7", "10.20.0.7", "172.17.0.1"]
    # Debian's 127.0.1.1 for the host's own name is loopback too
    assert select({"lo": ["127.0.1.1"], "eth0": ["10.0.0.2"]}, ["lo", "eth0"], None) == ["10.0.0.2"]


def test_the_interface_variable_keeps_or_drops_interfaces_by_name_or_prefix():
    assert select(NODE, UP, "ib") == ["10.20.0.7"]  # a prefix: ib0 (ib1 is down)
    assert select(NODE, UP + ["ib1"], "ib0,ib1") == ["10.20.0.7", "10.21.0.7"]
    assert select(NODE, UP, "^docker,eno") == ["10.20.0.7"]
    assert select(NODE, UP, "eth") == []  # no such interface: nothing to offer, and the caller says so


def test_this_host_offers_addresses_that_are_its_own():
    own = host_addresses()
    assert all(not a.startswith("127.") for a in own)
    for addr in own:  # each can be bound here, so it is this host's
        with socket.socket() as s:
            s.bind((addr, 0))


def test_a_rank_takes_the_first_address_that_answers_and_the_probe_leaves_the_store_working():
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=10),
                          wait_for_workers=False)
    # 240.0.0.1 is reserved (RFC 1112), assigned to no host, so it cannot answer
    assert reachable(["240.0.0.1", "127.0.0.1"], store.port, timeout_s=5) == "127.0.0.1"
    client = dist.TCPStore("127.0.0.1", store.port, 2, False, timeout=datetime.timedelta(seconds=10))
    client.set("k", "v")  # the probe's connection did not upset the server
    assert store.get("k") == b"v"
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert reachable(["127.0.0.1"], free, timeout_s=0.5) is None


def test_ranks_on_different_hosts_meet_at_an_interface_address_not_loopback():
    proc = mpi_python(2, "rendezvous_hosts.py", timeout=120)
    assert proc.returncode == 0, explain(proc)
    reached = re.findall(r"rank (\d) reached the store at (\S+), allreduce \[3.0, 3.0, 3.0, 3.0\]",
                         proc.stdout)
    assert sorted(r for r, _ in reached) == ["0", "1"], explain(proc)
    assert {addr for _, addr in reached} <= set(host_addresses()), explain(proc)


def test_an_interface_filter_that_matches_nothing_stops_every_rank_with_the_reason():
    proc = mpi_python(2, "rendezvous_hosts.py", "fail", timeout=120)
    assert proc.returncode != 0, explain(proc)
    assert "DOWNPOUR_SOCKET_IFNAME='no-such-interface' is not valid: no interface" in proc.stderr, \
        explain(proc)
    assert "reached the store" not in proc.stdout
