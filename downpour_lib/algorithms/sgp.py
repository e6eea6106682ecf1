"""Stochastic Gradient Push (SGP): push-sum gossip instead of a global allreduce.

Assran, Loizou, Ballas and Rabbat, "Stochastic Gradient Push for Distributed Deep Learning",
ICML 2019, Algorithm 1. Each step every rank (1) computes a gradient at its de-biased parameters
z_i = x_i / w_i, (2) applies the optimizer's update to the push-sum numerator x_i, (3) sends a
share of (x_i, w_i) to its out-peers on a time-varying directed exponential graph and adds the
shares it receives, (4) de-biases. With one peer per step a rank's traffic stays one model per step
however many ranks there are. Communication is synchronous: the shares of step t are absorbed in
step t (``osgp`` overlaps them with the next step instead).

What is evaluated is rank 0's de-biased model, which the parameters hold between steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..options import PushSumOptions, SGPOptions
from .decentralized import Decentralized
from .push_sum import PushSum


class PushSumAlgorithm(Decentralized):
    """Set-up, update and evaluation common to SGP and Overlap-SGP; they differ in after_step."""

    options: PushSumOptions

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        self.setup_graph(model)
        self.push_sum = PushSum(self.params, self.topology, self.comm, self.rank)
        self.step_index = 0
        return model

    def after_backward(self, model: nn.Module) -> None:
        # The gradient was taken at z; the update (``step``) goes to the numerator x = w z.
        self.push_sum.to_numerators()

    @contextmanager
    def eval_parameters(self, model: nn.Module) -> Iterator[nn.Module]:
        # The parameters hold z = x / w between steps (after_step ends with debias()).
        yield model

    def state_dict(self) -> dict[str, Any]:
        return self.push_sum.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.push_sum.load_state_dict(state)


class SGP(PushSumAlgorithm):
    name = "sgp"
    Options = SGPOptions
    options: SGPOptions

    def after_step(self, model: nn.Module) -> None:
        posted = self.push_sum.post(self.step_index)
        self.push_sum.absorb(self.comm.complete(posted, account="comm"))
        self.push_sum.debias()
        self.step_index += 1
