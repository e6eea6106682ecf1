"""D-PSGD: decentralized parallel SGD, symmetric averaging with the graph neighbours every step.

Lian, Zhang, Zhang, Hsieh, Zhang and Liu, "Can Decentralized Algorithms Outperform Centralized
Algorithms? A Case Study for Decentralized Parallel Stochastic Gradient Descent", NeurIPS 2017,
Algorithm 1: each step rank i computes a stochastic gradient at its parameters x_i^t and, in
parallel, averages x_i^t with its neighbours' through a symmetric doubly-stochastic matrix W; then
x_i^{t+1} = sum_j W_ij x_j^t - lr * grad f_i(x_i^t) (with this run's optimizer for the last term).

The "in parallel" is real here: the exchange of x^t is posted at the end of step t - 1 (for the
first step, in its ``after_backward``: the parameters may still be loaded from a checkpoint after
``setup``), travels during step t's forward and backward passes, and is completed and mixed in
``after_backward``, before the optimizer applies the gradient to the mixed parameters. Mixing uses
uniform weights 1/(degree + 1) on an undirected regular graph (ring or complete), which makes W
symmetric and doubly stochastic (``mixing.is_doubly_stochastic``), so no push-sum weight is needed.
``close`` completes the exchange posted after the last step (every rank posts it, so it has a
partner) and leaves the parameters as the last update made them.
"""

from __future__ import annotations

import torch
from torch import nn

from ..comm.collectives import flatten, unflatten_into
from ..comm.p2p import Exchange
from ..mixing import uniform_weights
from ..options import DPSGDOptions
from .decentralized import Decentralized


class DPSGD(Decentralized):
    name = "dpsgd"
    Options = DPSGDOptions
    options: DPSGDOptions

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        self.setup_graph(model)
        self.step_index = 0
        self.posted: Exchange | None = None  # posted at the first after_backward, then after_step
        return model

    def _post(self) -> Exchange:
        """Send x^t to the neighbours and receive theirs, without waiting."""
        peers = self.topology.out_peers(self.rank, self.step_index)
        self.sent = flatten([p.detach() for p in self.params])
        return self.comm.exchange(self.sent, peers, peers, tag=self.step_index)

    @torch.no_grad()
    def after_backward(self, model: nn.Module) -> None:
        if self.posted is None:  # the first step: nothing was posted during it
            self.posted = self._post()
        received = self.comm.complete(self.posted, account="wait")
        if received:
            keep, give = uniform_weights(len(received))
            mixed = self.sent * keep
            for x in received:
                mixed.add_(x, alpha=give)
            unflatten_into(mixed, self.params)  # the gradient (taken at x^t) is applied to this

    def after_step(self, model: nn.Module) -> None:
        self.step_index += 1
        self.posted = self._post()

    def close(self) -> None:
        if self.posted is not None:
            self.comm.complete(self.posted)
            self.posted = None
