"""Elastic averaging SGD (Zhang, Choromanska & LeCun, NIPS 2015, "Deep learning with Elastic
Averaging SGD"): the workers explore on their own and are pulled towards a center variable x~
every tau = ``period`` steps, and the center towards them, with moving rate alpha = eta * rho
(``moving_rate``; default 0.9 / N, the paper's beta = N alpha = 0.9).

Synchronous (``mode=sync``, the paper's Algorithm 1), every worker at once:

    x_i <- x_i - alpha (x_i - x~)            for every worker i
    x~  <- x~  + alpha sum_i (x_i - x~)      (the x_i before their own pull)

The center is kept on every worker (the sum is one allreduce), so it is the same everywhere; it
is what is evaluated and what the run ends with. Buffers (batch-norm statistics) are averaged at
each pull.

Asynchronous (``mode=async``, Algorithm 2, the center on a server rank) is its own module,
``easgd_async``, on the parameter-server protocol Downpour uses; the options here choose it
(``variant``), so ``--algorithm easgd --mode async`` is spelled as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from ..comm.collectives import flatten, unflatten_into
from ..errors import ConfigError
from ..options import check_workers
from .base import Roles
from .localsgd import Periodic, PeriodicOptions

SERVER = 0  # the asynchronous center's rank



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

@dataclass(frozen=True)
class EASGDOptions(PeriodicOptions):
    #: for the performance model, by ``variant()``: async pulls from a center on a server rank
    traffic_variants: ClassVar[dict[str, str]] = {"async": "async_push_pull"}
    moving_rate: float | None = field(default=None, metadata={
        "help": "easgd: the moving rate alpha = eta * rho, in (0, 1/N]; none = 0.9 / N"})
    mode: Literal["sync", "async"] = field(default="sync", metadata={
        "help": "easgd: sync (every worker pulls at once, the center on every worker) or async "
                "(the center on a server rank, rank 0; each worker pulls on its own clock)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.moving_rate is not None and not (
                math.isfinite(self.moving_rate) and 0 < self.moving_rate <= 1):
            raise ConfigError("moving_rate", self.moving_rate, "must be in (0, 1], e.g. 0.1")

    def alpha(self, workers: int) -> float:
        return self.moving_rate or 0.9 / workers

    def checkpoint_refusal(self) -> str | None:
        if self.mode == "async":
            return "easgd with mode=async does not write checkpoints yet; use mode=sync"
        return None

    def variant(self) -> str:
        return self.mode  # "async": easgd_async.AsyncEASGD runs it

    def stop_refusal(self) -> str | None:
        if self.mode == "async":  # its server takes no steps to vote at
            return "easgd with mode=async cannot stop early or checkpoint"
        return None

    def roles(self, world_size: int) -> Roles:
        workers = world_size - (self.mode == "async")
        if workers < 1:
            raise ConfigError("mode", self.mode, "needs a server rank and at least one worker: "
                                                 "launch 2 ranks or more")
        if self.alpha(workers) * workers > 1:
            raise ConfigError("moving_rate", self.moving_rate,
                              f"alpha x workers = {self.alpha(workers) * workers:g} > 1 makes the "
                              f"center overshoot; use at most {1 / workers:g} with "
                              f"{workers} workers")
        if self.mode == "sync":
            return super().roles(world_size)
        return Roles(world_size, tuple(range(1, world_size)), (SERVER,), evaluator=1)

    def roles_for(self, workers: int) -> Roles:
        return self.roles(check_workers(workers) + (self.mode == "async"))


class EASGD(CenterState, Periodic):
    """Synchronous EASGD; ``mode=async`` runs ``easgd_async.AsyncEASGD`` instead (``variant``)."""

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
