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

import torch
from torch import nn

from ..comm.collectives import flatten
from ..comm.gossip import consensus_distance
from ..options import GraphOptions
from .base import Algorithm


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
