"""Communicators for subsets of ranks, the node hierarchy, and hierarchical allreduce.

Groups come from a list of ranks (``new_group``), from a partition of the world (``split``), or from
host names: the ranks on one node form its node-local group, and the first rank of each node (its
leader) joins the cross-node leaders' group. ``Hierarchy.allreduce`` is the two-level allreduce of
TorchMPI (Tran et al. 2016) and Horovod's hierarchical mode (Sergeev & Del Balso 2018): reduce inside
each node, allreduce among the leaders, broadcast inside each node. Inside a node the data moves over
shared memory; only one rank per node touches the network. Its result equals the flat allreduce (up
to the order of floating-point additions).

``node_groups`` and ``node_leaders`` are pure functions of the host names, so the grouping can be
tested, and exercised on one machine, with a made-up host assignment.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from . import runtime
from .collectives import Communicator, Op, Tensors, pack, reduce_op


def node_groups(hosts: Sequence[str]) -> list[tuple[int, ...]]:
    """The ranks on each host (``hosts[r]`` is rank r's host), hosts in the order of their first rank."""
    groups: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        groups.setdefault(host, []).append(rank)
    return [tuple(ranks) for ranks in groups.values()]


def node_leaders(hosts: Sequence[str]) -> tuple[int, ...]:
    """The lowest rank on each host: the one that talks to the other nodes."""
    return tuple(group[0] for group in node_groups(hosts))


def new_group(ranks: Sequence[int], backend: str | None = None) -> Communicator:
    """A communicator over the global ``ranks``; ``backend`` (e.g. "mpi" beside a gloo world) gives
    it a process group of its own on that backend, even over every rank.

    Collective over the world: every rank must call it, members or not, with the same ranks and in
    the same order relative to other group creations (torch.distributed's rule). On a non-member the
    result has ``rank`` None and refuses collectives.
    """
    world = Communicator.world()
    members = tuple(sorted(set(ranks)))
    if len(members) != len(tuple(ranks)) or not members:
        raise ValueError(f"ranks={tuple(ranks)} is not valid: give distinct ranks, at least one")
    if members[0] < 0 or members[-1] >= world.size:
        raise ValueError(f"ranks={tuple(ranks)} is not valid: this world has ranks 0..{world.size - 1}")
    me = world.ranks[world.rank]
    if members == world.ranks and backend is None:
        return world
    if len(members) == 1:  # nothing to communicate: no process group (same decision on every rank)
        return Communicator(members, None, me)
    return Communicator(members, runtime.new_group(list(members), backend=backend), me)


def split(partition: Sequence[Sequence[int]]) -> Communicator:
    """Create one group per part of ``partition`` (which must cover every rank once) and return
    this rank's. Collective over the world, like ``new_group``."""
    world = Communicator.world()
    seen = sorted(r for part in partition for r in part)
    if seen != list(world.ranks):
        raise ValueError(f"partition={[tuple(p) for p in partition]} is not valid: it must hold "
                         f"each of the ranks 0..{world.size - 1} exactly once")
    mine = None
    for part in partition:
        comm = new_group(part)
        if comm.member:
            mine = comm
    assert mine is not None
    return mine


@dataclass(frozen=True)
class Hierarchy:
    """This rank's place in the two-level (node, leaders) hierarchy."""

    world: Communicator
    local: Communicator  # the ranks on this rank's node
    leaders: Communicator | None  # one rank per node; None on ranks that are not their node's leader
    hosts: tuple[str, ...]

    @classmethod
    def create(cls, hosts: Sequence[str] | None = None) -> Hierarchy:
        """Build the node and leader groups (collective over the world). ``hosts`` (host name of
        each rank, by rank) defaults to the real ones; pass a made-up assignment to try a
        multi-node layout on one machine."""
        world = Communicator.world()
        if hosts is None:
            hosts = world.allgather_object(socket.gethostname())
        hosts = tuple(hosts)
        if len(hosts) != world.size:
            raise ValueError(f"hosts has {len(hosts)} entries but the world has {world.size} "
                             "ranks: give one host name per rank")
        local = split(node_groups(hosts))
        leaders = new_group(node_leaders(hosts))
        return cls(world, local, leaders if leaders.member else None, hosts)

    @property
    def is_leader(self) -> bool:
        return self.leaders is not None

    def allreduce(self, x: Tensors, op: Op = "sum") -> Any:
        """Reduce in the node, allreduce among leaders, broadcast in the node; returns ``x``."""
        red = reduce_op(op)
        if not self.world.active:
            return x
        buf, write_back = pack(x)
        # In place on a private or flattened buffer: the broadcast overwrites whatever the
        # reduce leaves on non-leaders.
        if self.local.active:
            dist.reduce(buf, dst=self.local.ranks[0], op=red, group=self.local.group)
        if self.leaders is not None and self.leaders.active:
            dist.all_reduce(buf, op=red, group=self.leaders.group)
        if self.local.active:
            dist.broadcast(buf, src=self.local.ranks[0], group=self.local.group)
        if op == "mean":
            buf.div_(self.world.size)
        write_back()
        return x
