"""PyTorch DistributedDataParallel (Li et al., VLDB 2020): the baseline the others must beat.

Gradients are averaged by DDP's bucketed allreduce, overlapped with backward; the engine's timing
counts only the part of it that backward did not hide (see ``comm.ddp``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from torch import nn

from ..comm.ddp import MeteredDDP
from ..errors import ConfigError
from .allreduce import warn_one_bucket
from .base import Algorithm, AlgorithmOptions, Roles


@dataclass(frozen=True)
class DDPOptions(AlgorithmOptions):
    #: per step, for the performance model (downpour_lib.perf): the gradients allreduced in buckets
    traffic: ClassVar[str] = "collective"
    overflow: ClassVar[Literal["reduced"]] = "reduced"  # fp16: DDP averages in backward
    bucket_cap_mb: float = field(default=25.0, metadata={"help": "DDP gradient bucket size in MB"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (math.isfinite(self.bucket_cap_mb) and self.bucket_cap_mb > 0):
            raise ConfigError("bucket_cap_mb", self.bucket_cap_mb,
                              "must be a finite number of MB > 0, e.g. 25")


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
