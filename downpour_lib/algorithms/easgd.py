"""Elastic averaging SGD (Zhang, Choromanska & LeCun, NIPS 2015, "Deep learning with Elastic
Averaging SGD"), synchronous: the workers explore on their own and are pulled towards a center
variable x~ every tau = ``period`` steps, and the center towards them, with moving rate
alpha = eta * rho (``moving_rate``; default 0.9 / N, the paper's beta = N alpha = 0.9):

    x_i <- x_i - alpha (x_i - x~)            for every worker i
    x~  <- x~  + alpha sum_i (x_i - x~)      (the x_i before their own pull)

The center is kept on every worker (the sum is one allreduce), so it is the same everywhere; it
is what is evaluated and what the run ends with. Buffers (batch-norm statistics) are averaged at
each pull. The asynchronous variant, with the center on a server rank as TorchMPI had, is not
here yet.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..comm.collectives import flatten, unflatten_into
from ..errors import ConfigError
from .base import Roles
from .localsgd import Periodic, PeriodicOptions


@dataclass(frozen=True)
class EASGDOptions(PeriodicOptions):
    moving_rate: float | None = field(default=None, metadata={
        "help": "easgd: the moving rate alpha = eta * rho, in (0, 1/N]; none = 0.9 / N"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.moving_rate is not None and not (
                math.isfinite(self.moving_rate) and 0 < self.moving_rate <= 1):
            raise ConfigError("moving_rate", self.moving_rate, "must be in (0, 1], e.g. 0.1")

    def alpha(self, workers: int) -> float:
        return self.moving_rate or 0.9 / workers

    def roles(self, world_size: int) -> Roles:
        if self.alpha(world_size) * world_size > 1:
            raise ConfigError("moving_rate", self.moving_rate,
                              f"alpha x workers = {self.moving_rate * world_size:g} > 1 makes the "
                              f"center overshoot; use at most {1 / world_size:g} with "
                              f"{world_size} workers")
        return super().roles(world_size)


class EASGD(Periodic):
    name = "easgd"
    Options = EASGDOptions
    options: EASGDOptions

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        model = super().setup(model, optimizer)
        self.alpha = self.options.alpha(self.world_size)
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

    @contextmanager
    def eval_parameters(self, model: nn.Module) -> Iterator[nn.Module]:
        """The center, in the model's place while it is evaluated (or checkpointed)."""
        own = flatten([p.detach() for p in self.params]).clone()
        with torch.no_grad():
            unflatten_into(self.center, self.params)
        try:
            yield model
        finally:
            with torch.no_grad():
                unflatten_into(own, self.params)

    def state_dict(self) -> dict[str, Any]:
        return {"center": self.center.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.center.copy_(state["center"])
