"""SlowMo (Wang, Tantia, Ballas & Rabbat, ICLR 2020, "SlowMo: Improving Communication-Efficient
Distributed SGD with Slow Momentum"): a base method (local SGD, or SGP's gossip) runs on every
worker; at each meeting the workers average their parameters exactly and take a slow momentum step
from the parameters of the previous meeting x0:

    u  <- beta * u + (x0 - x_avg) / gamma
    x0 <- x0 - alpha * gamma * u

gamma is the base optimizer's current learning rate, beta ``slow_momentum``, alpha ``slow_lr``.
With beta = 0 and alpha = 1 the step lands on x_avg: SlowMo is then its base with exact averaging
at the meetings (a test checks it against localsgd). The meetings are local SGD's (step t, from 0,
when ``t >= sync_steps`` and ``(t - sync_steps) % period == 0``); with SGP as the base, the exact
average is the average of the push-sum numerators, after which every weight is 1 again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..comm.collectives import flatten, unflatten_into
from ..options import SGPOptions, SlowMoOptions
from .localsgd import LocalSGD
from .sgp import SGP


class SlowMo(LocalSGD):
    name = "slowmo"
    Options = SlowMoOptions
    options: SlowMoOptions

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        model = super().setup(model, optimizer)
        self.gossip: SGP | None = None
        if self.options.base == "sgp":
            self.gossip = SGP(SGPOptions(), self.comm)
            self.gossip.setup(model, optimizer)
        self.x0 = flatten([p.detach() for p in self.params]).clone()
        self.u = torch.zeros_like(self.x0)
        self.gamma = optimizer.param_groups[0]["lr"]
        return model

    def after_backward(self, model: nn.Module) -> None:
        if self.gossip is not None:
            self.gossip.after_backward(model)
        else:
            super().after_backward(model)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.gamma = optimizer.param_groups[0]["lr"]
        optimizer.step()

    def after_step(self, model: nn.Module) -> None:
        if self.gossip is not None:
            self.gossip.after_step(model)
        sync, period = self.options.sync_steps, self.options.period
        self.met = self.t >= sync and (self.t - sync) % period == 0
        if self.met:
            self._meet()
        self.t += 1

    @torch.no_grad()
    def _meet(self) -> None:
        if self.gossip is not None:  # the exact average of push-sum is that of the numerators
            self.gossip.push_sum.to_numerators()
            self.gossip.push_sum.weight = 1.0
        self.average_(self.state())
        x_avg = flatten([p.detach() for p in self.params])
        beta, alpha, gamma = self.options.slow_momentum, self.options.slow_lr, self.gamma
        self.u.mul_(beta).add_((self.x0 - x_avg) / gamma)
        self.x0.sub_(self.u, alpha=alpha * gamma)
        unflatten_into(self.x0, self.params)

    def state_dict(self) -> dict[str, Any]:
        state = {"x0": self.x0.clone(), "u": self.u.clone()}
        if self.gossip is not None:
            state.update(self.gossip.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.x0.copy_(state["x0"])
        self.u.copy_(state["u"])
        if self.gossip is not None:
            self.gossip.load_state_dict(state)
