"""Options of the gossip algorithms (``sgp``, ``osgp``, ``dpsgd``, ``adpsgd``): the graph each may
use and the check that it fits the world, which is their world check; ``max_lag`` of those that
keep communicating while they compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..errors import ConfigError
from ..topology import Topology, make_topology
from .base import AlgorithmOptions, Roles, check_whole


@dataclass(frozen=True)
class GraphOptions(AlgorithmOptions):
    """Options of a gossip algorithm: a ``topology`` field (each subclass names the graphs it
    can use) and the check that the graph fits the world, which is the algorithm's world check."""

    #: Whether the algorithm's averaging needs an undirected graph (out-peers == in-peers).
    needs_symmetric: ClassVar[bool] = False

    def fanout(self) -> int:
        """Out-peers per step."""
        return 1

    def graph(self, world_size: int) -> Topology:
        topology = make_topology(self.topology, world_size, self.fanout())
        if self.needs_symmetric and not topology.symmetric:
            raise ConfigError("topology", self.topology,
                              "this algorithm averages in pairs and needs an undirected graph")
        return topology

    def roles(self, world_size: int) -> Roles:
        self.graph(world_size)  # raises ConfigError (field, value, fix) if unfit
        return super().roles(world_size)


@dataclass(frozen=True)
class BoundedLagOptions(GraphOptions):
    """``max_lag`` of the gossip algorithms that keep communicating while they compute (osgp,
    adpsgd). A subclass says what the lag bounds and which algorithm has none."""

    lag_bounds: ClassVar[str] = ""  # e.g. "messages stay in flight for at most that many steps"
    without_lag: ClassVar[str] = ""  # e.g. "for synchronous push-sum use --algorithm sgp"

    max_lag: int = field(default=1, metadata={
        "help": "gossip started at step t is folded into the model by step t + max_lag at the "
                "latest (>= 1)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_whole("max_lag", self.max_lag, 1, f"{self.lag_bounds}; {self.without_lag}")


@dataclass(frozen=True)
class PushSumOptions(GraphOptions):
    #: per step, for the performance model: the model sent to k peers of the graph
    traffic: ClassVar[str] = "gossip"
    """Options of the push-sum algorithms (SGP and Overlap-SGP)."""

    topology: Literal["exponential", "ring", "complete"] = field(default="exponential", metadata={
        "help": "gossip graph: exponential (time-varying, directed; peer i + 2^k at step t), "
                "ring (both neighbours) or complete (everyone; one step is the exact average)"})
    peers_per_step: int = field(default=1, metadata={
        "help": "out-peers per step on the exponential graph (at most log2 of the ranks)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_whole("peers_per_step", self.peers_per_step, 1, "1 is SGP's default")
        if self.peers_per_step != 1 and self.topology != "exponential":
            raise ConfigError("peers_per_step", self.peers_per_step,
                              f"the {self.topology} graph has fixed neighbours; peers_per_step "
                              "applies to topology='exponential' only, so leave it at 1")

    def fanout(self) -> int:
        return self.peers_per_step


@dataclass(frozen=True)
class SGPOptions(PushSumOptions):
    pass


@dataclass(frozen=True)
class OSGPOptions(BoundedLagOptions, PushSumOptions):
    #: for the performance model: k-peer gossip hidden behind the next step's computation
    traffic: ClassVar[str] = "overlapped_gossip"
    lag_bounds: ClassVar[str] = "messages stay in flight for at most that many steps"
    without_lag: ClassVar[str] = "for synchronous push-sum use --algorithm sgp"


@dataclass(frozen=True)
class DPSGDOptions(GraphOptions):
    #: per step, for the performance model: the model exchanged with the graph's neighbours
    traffic: ClassVar[str] = "gossip"
    needs_symmetric: ClassVar[bool] = True

    topology: Literal["ring", "complete"] = field(default="ring", metadata={
        "help": "gossip graph: ring (both neighbours) or complete (everyone; one step is the "
                "exact average)"})


@dataclass(frozen=True)
class ADPSGDOptions(BoundedLagOptions):
    #: for the performance model: pairwise averaging on each worker's own clock
    traffic: ClassVar[str] = "async_gossip"
    lag_bounds: ClassVar[str] = "the averaging thread may fall that many steps behind"
    without_lag: ClassVar[str] = "for lock-step neighbour averaging use --algorithm dpsgd"
    needs_symmetric: ClassVar[bool] = True
    # fp16: asynchronous, no rank steps with another; an overflowing one skips alone
    overflow: ClassVar[Literal["alone"]] = "alone"

    topology: Literal["bipartite_exponential"] = field(default="bipartite_exponential", metadata={
        "help": "gossip graph: bipartite_exponential (odd ranks pair with even ones; needs an "
                "even number of ranks)"})

    @property
    def stop_lag(self) -> int:  # training may run max_lag steps ahead of its partners' rounds
        return self.max_lag + 1
