"""DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language
Models"): every worker takes H = ``period`` inner steps on its own (the run's optimizer; by default
AdamW at lr 0.003, as the paper's inner optimizer is AdamW: with SGD + momentum and 0.05, 10 epochs
of lenet on digits at 4 workers ended anywhere from 0.74 to 0.89 over three seeds, with AdamW at
0.92 on each), then the workers average their pseudo-gradient, the global parameters
minus their own, and an outer SGD with Nesterov momentum steps the global parameters with it;
every worker continues from the result.

With H = 1, an inner SGD without momentum, outer lr 1 and no outer momentum this is allreduce SGD
(a test checks it). The pseudo-gradient may travel in bf16 or fp16 (OpenDiLoCo, Jaghouar et al.
2024, found fp16 lossless), halving the bytes, which are already about 1/H of allreduce SGD's.
The inner optimizer's state stays each worker's own, as in the paper; buffers (batch-norm
statistics) are averaged at each outer step. The last step of a run is always an outer step, so
the run ends on the global parameters.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..comm.collectives import flatten, unflatten_into
from ..options import DiLoCoOptions
from .localsgd import Periodic

WIRE = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class DiLoCo(Periodic):
    name = "diloco"
    Options = DiLoCoOptions
    options: DiLoCoOptions

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        model = super().setup(model, optimizer)
        # the global parameters: one flat vector, stepped by the outer optimizer
        self.global_params = nn.Parameter(flatten([p.detach() for p in self.params]).clone())
        m = self.options.outer_momentum
        self.outer = torch.optim.SGD([self.global_params], lr=self.options.outer_lr, momentum=m,
                                     nesterov=m > 0)
        return model

    def after_step(self, model: nn.Module) -> None:
        self.t += 1
        self.met = self.t % self.options.period == 0 or self.t == self.total
        if self.met:
            self._outer_step()

    def _outer_step(self) -> None:
        with torch.no_grad():
            delta = self.global_params.detach() - flatten([p.detach() for p in self.params])
            wire = WIRE[self.options.pseudo_gradient]
            if self.comm.active:
                sent = delta if wire is None else delta.to(wire)
                self.comm.allreduce(sent)
                delta = sent.to(delta.dtype).div_(self.comm.size)
            self.global_params.grad = delta
            self.outer.step()
            unflatten_into(self.global_params.detach(), self.params)
        self.average_(self.buffers)

    def state_dict(self) -> dict[str, Any]:
        return {"global": self.global_params.detach().clone(), "outer": self.outer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.global_params.copy_(state["global"])
        self.outer.load_state_dict(state["outer"])
