"""Elastic averaging SGD (Zhang, Choromanska & LeCun, NIPS 2015, "Deep learning with Elastic
Averaging SGD"): the workers explore on their own and are pulled towards a center variable x~
every tau = ``period`` steps, and the center towards them, with moving rate alpha = eta * rho
(``moving_rate``; default 0.9 / N, the paper's beta = N alpha = 0.9).

Synchronous, the paper's Algorithm 1, every worker at once:

    x_i <- x_i - alpha (x_i - x~)            for every worker i
    x~  <- x~  + alpha sum_i (x_i - x~)      (the x_i before their own pull)

The center is kept on every worker (the sum is one allreduce), so it is the same everywhere; it
is what is evaluated and what the run ends with. Buffers (batch-norm statistics) are averaged at
each pull.

Asynchronous EASGD (Algorithm 2, the center on a server rank) is its own algorithm,
``easgd_async`` (its module of that name), on the parameter-server protocol Downpour uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..comm.collectives import flatten, unflatten_into
from ..options import EASGDOptions
from .localsgd import Periodic


@contextmanager
def center_in_place(params: list[torch.Tensor], center: torch.Tensor) -> Iterator[None]:
    """The center (flat) in the parameters' place for the block, then their own values back:
    what is evaluated and checkpointed is the center, in synchronous and asynchronous EASGD."""
    own = flatten([p.detach() for p in params]).clone()
    with torch.no_grad():
        unflatten_into(center.to(own.device), params)
    try:
        yield
    finally:
        with torch.no_grad():
            unflatten_into(own, params)


class CenterState:
    """What an EASGD run evaluates and checkpoints: the center variable x~ (``self.center``,
    flat), shared by the synchronous and the asynchronous algorithm."""

    center: torch.Tensor
    params: list[torch.Tensor]

    @contextmanager
    def eval_parameters(self, model: nn.Module) -> Iterator[nn.Module]:
        """The center, in the model's place while it is evaluated (or checkpointed)."""
        with center_in_place(self.params, self.center):
            yield model

    def state_dict(self) -> dict[str, Any]:
        return {"center": self.center.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.center.copy_(state["center"])


class EASGD(CenterState, Periodic):
    """Synchronous EASGD (``easgd_async.AsyncEASGD`` is the asynchronous one)."""

    name = "easgd"
    Options = EASGDOptions
    options: EASGDOptions

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        model = super().setup(model, optimizer)
        self.alpha = self.options.alpha(len(self.roles.workers))
        self.center = flatten([p.detach() for p in self.params]).clone()
        return model

    def after_step(self, model: nn.Module) -> None:
        self.t += 1
        self.met = self.t % self.options.period == 0
        if self.met:
            self._pull()

    @torch.no_grad()
    def _pull(self) -> None:
        x = flatten([p.detach() for p in self.params])
        diff = x - self.center
        total = diff.clone()
        if self.comm.active:
            self.comm.allreduce(total)
        unflatten_into(x - self.alpha * diff, self.params)
        self.center.add_(total, alpha=self.alpha)
        self.average_(self.buffers)
