"""PyTorch DistributedDataParallel (Li et al., VLDB 2020): the baseline the others must beat.

Gradients are averaged by DDP's bucketed allreduce, overlapped with backward; the engine's timing
counts only the part of it that backward did not hide (see ``comm.ddp``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..comm.ddp import MeteredDDP
from ..options import DDPOptions
from .allreduce import warn_one_bucket
from .base import Algorithm, Roles


class DDP(Algorithm):
    name = "ddp"
    Options = DDPOptions
    options: DDPOptions

    @classmethod
    def check_plan(cls, options: DDPOptions, roles: Roles, model: nn.Module, total_steps: int,
                   report: Callable[[str], None], precision: str = "fp32") -> None:
        super().check_plan(options, roles, model, total_steps, report, precision)
        warn_one_bucket(options, model, report)

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        self.ddp = None
        if not self.comm.active:
            return model
        self.ddp = MeteredDDP(model, self.comm, self.options.bucket_cap_mb)
        return self.ddp.module

    def after_backward(self, model: nn.Module) -> None:
        if self.ddp is not None:
            self.ddp.after_backward()
