"""What the gossip algorithms (sgp, osgp, dpsgd, adpsgd) share: a graph and a consensus measure.

Decentralized training in the sense of Lian et al. (NeurIPS 2017) and Assran et al. (ICML 2019):
every rank is a worker with its own copy of the model, and copies agree only through gossip with a
few peers per step. Each rank's model therefore differs; the engine evaluates rank 0's (as the SGP
paper does), and ``metrics`` adds ``consensus_distance``, the mean over ranks of
||x_i - x_bar||, x_bar the ranks' average, computed on every rank at every evaluation point.

This module holds behaviour, not switches: the options say which graph (``GraphOptions.graph``,
which also checks that it fits the world before any rank starts) and the subclass which vector is
its rank's model (``local_vector``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from ..comm.collectives import flatten
from ..comm.gossip import consensus_distance
from ..errors import ConfigError
from ..topology import Topology, make_topology
from .base import Algorithm, AlgorithmOptions, Roles


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
        if self.max_lag < 1:
            raise ConfigError("max_lag", self.max_lag,
                              f"must be a whole number >= 1 ({self.lag_bounds}); {self.without_lag}")


class Decentralized(Algorithm):
    """Base of the gossip algorithms: the graph its options name, a consensus measure."""

    options: GraphOptions

    def setup_graph(self, model: nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.is_floating_point()]
        self.topology = self.options.graph(self.world_size)

    def local_vector(self, model: nn.Module) -> torch.Tensor:
        """This rank's model as one flat vector (de-biased, for push-sum)."""
        return flatten([p.detach() for p in model.parameters()])

    def metrics(self, model: nn.Module | None = None) -> dict[str, float]:
        if model is None:
            return {}
        # Collective: the engine calls this on every rank at the same evaluation points.
        return {"consensus_distance": consensus_distance(self.comm, self.local_vector(model))}
