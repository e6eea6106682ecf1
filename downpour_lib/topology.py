"""Gossip graphs: who sends to whom at each step. Pure functions of (rank, step, world size).

The graphs of Assran et al., "Stochastic Gradient Push for Distributed Deep Learning" (ICML 2019)
and of the methods they compare with:

- ``exponential``: the time-varying directed exponential graph SGP gossips over. At step t rank i
  sends to (i + 2^k) mod n with k cycling through 0 .. floor(log2(n - 1)), ``peers_per_step``
  consecutive values of k per step. One peer per step means the bytes a rank sends do not grow with
  n, and for n a power of two, log2(n) steps of uniform mixing average exactly.
- ``ring``: the undirected ring (neighbours i - 1 and i + 1), D-PSGD's graph in Lian et al.,
  "Can Decentralized Algorithms Outperform Centralized Algorithms?" (NeurIPS 2017).
- ``complete``: everyone talks to everyone; one uniform mixing step is the exact average.
- ``bipartite_exponential``: AD-PSGD's graph (Lian et al., "Asynchronous Decentralized Parallel
  Stochastic Gradient Descent", ICML 2018): odd ranks are active, even ranks passive, and every edge
  joins the two sides, so concurrent pairwise averages never form a cycle. At step t active rank i
  pairs with passive (i + o_t) mod n, o_t cycling through the odd offsets 1, 3, 5, 9, 17, ...
  (1 + 2^k, as in the SGP authors' bipartite exponential graph); each step is a perfect matching.

No torch.distributed here: a topology is a plain object that unit tests can enumerate.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from .errors import ConfigError, unknown_name


class Topology(ABC):
    """A (possibly time-varying) directed graph on ``world_size`` ranks."""

    name: ClassVar[str]
    #: Out-peers equal in-peers for every rank at every step (an undirected graph).
    symmetric: ClassVar[bool]

    def __init__(self, world_size: int, peers_per_step: int = 1) -> None:
        if world_size < 1:
            raise ConfigError("world_size", world_size, "must be a whole number >= 1")
        if peers_per_step < 1:
            raise ConfigError("peers_per_step", peers_per_step, "must be a whole number >= 1")
        self.world_size, self.peers_per_step = world_size, peers_per_step
        self.check()

    def check(self) -> None:  # noqa: B027 -- most graphs fit any world size
        """Raise ConfigError if this graph cannot be built on ``world_size`` ranks."""

    @property
    def period(self) -> int:
        """Steps after which the peers repeat (1 for a static graph)."""
        return 1

    @abstractmethod
    def out_peers(self, rank: int, step: int) -> tuple[int, ...]:
        """The ranks ``rank`` sends to at ``step`` (never itself, no repeats)."""

    def in_peers(self, rank: int, step: int) -> tuple[int, ...]:
        """The ranks ``rank`` receives from at ``step``. Generic (O(n)); subclasses shortcut it."""
        return tuple(j for j in range(self.world_size) if rank in self.out_peers(j, step))

    def edges(self, step: int) -> set[tuple[int, int]]:
        """Every (sender, receiver) pair at ``step``."""
        return {(i, j) for i in range(self.world_size) for j in self.out_peers(i, step)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(world_size={self.world_size}, " \
               f"peers_per_step={self.peers_per_step})"


def exponential_offsets(world_size: int) -> tuple[int, ...]:
    """1, 2, 4, ... below ``world_size``: the hops of the exponential graph."""
    offsets, hop = [], 1
    while hop < world_size:
        offsets.append(hop)
        hop *= 2
    return tuple(offsets)


class Exponential(Topology):
    name = "exponential"
    symmetric = False

    def check(self) -> None:
        available = len(exponential_offsets(self.world_size))
        if self.world_size > 1 and self.peers_per_step > available:
            raise ConfigError(
                "peers_per_step", self.peers_per_step,
                f"the exponential graph on {self.world_size} ranks has {available} distinct peer(s) "
                f"per rank (hops {', '.join(map(str, exponential_offsets(self.world_size)))}); "
                f"use at most {available}, or launch more ranks")

    @property
    def period(self) -> int:
        return max(1, len(exponential_offsets(self.world_size)))

    def _hops(self, step: int) -> tuple[int, ...]:
        hops = exponential_offsets(self.world_size)
        if not hops:
            return ()
        # peers_per_step consecutive hops, the window advancing by peers_per_step each step
        return tuple(hops[(step * self.peers_per_step + j) % len(hops)]
                     for j in range(self.peers_per_step))

    def out_peers(self, rank: int, step: int) -> tuple[int, ...]:
        return tuple((rank + h) % self.world_size for h in self._hops(step))

    def in_peers(self, rank: int, step: int) -> tuple[int, ...]:
        return tuple((rank - h) % self.world_size for h in self._hops(step))


class Ring(Topology):
    name = "ring"
    symmetric = True

    def out_peers(self, rank: int, step: int) -> tuple[int, ...]:
        n = self.world_size
        return tuple(sorted({(rank - 1) % n, (rank + 1) % n} - {rank}))

    in_peers = out_peers


class Complete(Topology):
    name = "complete"
    symmetric = True

    def out_peers(self, rank: int, step: int) -> tuple[int, ...]:
        return tuple(j for j in range(self.world_size) if j != rank)

    in_peers = out_peers


def bipartite_offsets(world_size: int) -> tuple[int, ...]:
    """1, 3, 5, 9, 17, ... (1 and 1 + 2^k) below ``world_size``: odd, so they cross sides."""
    if world_size < 2:
        return ()
    offsets, k = [1], 1
    while 1 + 2 ** k < world_size:
        offsets.append(1 + 2 ** k)
        k += 1
    return tuple(offsets)


class BipartiteExponential(Topology):
    name = "bipartite_exponential"
    symmetric = True

    def check(self) -> None:
        if self.world_size > 1 and self.world_size % 2:
            # the number of ranks is what to change: the graph is adpsgd's default and only
            # choice, a value the user may never have set
            raise ConfigError(
                "world_size", self.world_size,
                "adpsgd's graph, topology='bipartite_exponential' (its default and only one), "
                "pairs odd (active) with even (passive) ranks, so it needs an even number of "
                f"ranks; launch {self.world_size - 1} or {self.world_size + 1} ranks, or use sgp "
                "or dpsgd, which run on any number")
        if self.peers_per_step != 1:
            raise ConfigError("peers_per_step", self.peers_per_step,
                              "the bipartite graph pairs each rank with exactly 1 peer per step; use 1")

    @staticmethod
    def is_active(rank: int) -> bool:
        """Active ranks (odd) start each pairwise exchange; passive ones (even) answer."""
        return rank % 2 == 1

    @property
    def period(self) -> int:
        return max(1, len(bipartite_offsets(self.world_size)))

    def out_peers(self, rank: int, step: int) -> tuple[int, ...]:
        offsets = bipartite_offsets(self.world_size)
        if not offsets:
            return ()
        hop = offsets[step % len(offsets)]
        # i -> i + hop is a bijection from odd onto even ranks (n even, hop odd): a perfect matching
        return (((rank + hop) if self.is_active(rank) else (rank - hop)) % self.world_size,)

    in_peers = out_peers


TOPOLOGIES: dict[str, type[Topology]] = {
    cls.name: cls for cls in (Exponential, Ring, Complete, BipartiteExponential)}


def make_topology(name: str, world_size: int, peers_per_step: int = 1) -> Topology:
    """The graph ``name`` on ``world_size`` ranks; ConfigError (field, value, fix) if it cannot be."""
    if name not in TOPOLOGIES:
        raise unknown_name("topology", name, TOPOLOGIES)
    return TOPOLOGIES[name](world_size, peers_per_step)


def strongly_connected(edges: set[tuple[int, int]], world_size: int) -> bool:
    """Every rank reaches every other along ``edges`` (directed)."""

    def reach(start: int, forward: bool) -> set[int]:
        seen, todo = {start}, [start]
        while todo:
            node = todo.pop()
            for a, b in edges:
                src, dst = (a, b) if forward else (b, a)
                if src == node and dst not in seen:
                    seen.add(dst)
                    todo.append(dst)
        return seen

    everyone = set(range(world_size))
    return reach(0, True) == everyone and reach(0, False) == everyone
