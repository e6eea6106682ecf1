"""Learning-rate schedules: the learning rate as a pure function of the step.

The recipes our users reproduce: a linear warm-up (Goyal et al. 2017, "Accurate, Large Minibatch
SGD": 5 epochs), then constant, step decay (He et al. 2016; SGP's decay by 10 at epochs 30, 60 and
80) or cosine decay to zero (Loshchilov & Hutter 2017); optionally the linear scaling rule, the
learning rate times the global batch over a reference batch (Goyal et al.: 0.1 per 256 images).

Epochs are converted to steps with the run's steps per epoch, which depends only on the global
batch (``ShardSampler``), so N workers on batch B and one process on batch N x B follow the same
schedule step for step, and synchronous algorithms still equal one process on the N-times batch.
The engine sets the workers' optimizer to ``lr(step)`` before each step; an algorithm whose
updates happen elsewhere applies it there (a synchronous server at the step it completes,
Downpour's servers at the step of the push they apply).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LRSchedule:
    peak: float  # the learning rate after warm-up (scaled by the linear rule, if asked for)
    kind: str = "constant"  # constant | step | cosine
    warmup_steps: int = 0
    milestones: tuple[int, ...] = ()  # steps at which a step schedule multiplies by ``decay``
    decay: float = 0.1
    total_steps: int = 1

    @classmethod
    def of(cls, config, steps_per_epoch: int, total_steps: int, workers: int) -> LRSchedule:
        """The schedule ``config`` (a TrainConfig) asks for, in a run of ``total_steps`` steps of
        ``steps_per_epoch`` each, with ``workers`` workers (for the linear scaling rule)."""
        optim = config.optim
        peak = optim.lr
        if optim.lr_scaling == "linear":
            peak *= config.data.batch_size * workers / optim.lr_reference_batch
        return cls(peak, optim.lr_schedule, round(optim.lr_warmup_epochs * steps_per_epoch),
                   tuple(round(m * steps_per_epoch) for m in optim.lr_milestones),
                   optim.lr_decay, total_steps)

    def __call__(self, step: int) -> float:
        """The learning rate of step ``step`` (counted from 0 over the whole run, resumes
        included)."""
        if step < self.warmup_steps:  # linear from peak/warmup_steps to peak
            return self.peak * (step + 1) / self.warmup_steps
        if self.kind == "step":
            return self.peak * self.decay ** sum(step >= m for m in self.milestones)
        if self.kind == "cosine":
            span = max(1, self.total_steps - self.warmup_steps)
            return self.peak * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - self.warmup_steps) / span)))
        return self.peak


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
