"""AllReduce SGD: synchronous data-parallel SGD whose gradient average is a bucketed allreduce that
overlaps the backward pass (Horovod: Sergeev & Del Balso 2018; PyTorch DDP: Li et al., VLDB 2020).

Every rank computes gradients on its own shard of the batch; the gradients are averaged by
allreduce, so each rank takes the same step as one process on the N-times batch would (Goyal et al.
2017, "Accurate, Large Minibatch SGD"). What makes it fast is in ``comm.buckets``: gradients are
packed into buckets in the order backward produces them, and each bucket's allreduce starts as soon
as it is full, while backward computes the rest; only the last bucket's communication is exposed.
Options add fp16/bf16 compression of what travels and gradient accumulation over k micro-batches
(one allreduce and one optimizer step per k backward passes).

Unlike DDP this is plain composition: the model is not wrapped, the hooks are
``Tensor.register_post_accumulate_grad_hook``, and in a world of one (with k = 1) nothing is
installed at all. Buffers (batch-norm statistics) stay per rank, as in Horovod.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..comm.buckets import GradientBuckets
from ..comm.model_sync import synchronize_parameters
from ..errors import ConfigError
from ..options import AllReduceOptions
from .base import Algorithm, Roles

WIRE_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def warn_one_bucket(options: AllReduceOptions | Any, model: nn.Module,
                    report: Callable[[str], None]) -> None:
    """A bucket raised past the model's size: one bucket, so nothing of the allreduce overlaps
    backward. Legal, and pointless unless meant (as the config warns for momentum that does
    nothing). For every options class with a ``bucket_cap_mb`` (allreduce's, DDP's)."""
    cap, default = options.bucket_cap_mb, type(options)().bucket_cap_mb
    if cap <= default:
        return
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if cap * 2**20 >= nbytes:
        fix = (f"leave it at {default:g} or give" if default * 2**20 < nbytes  # the default splits it
               else "give")
        report(f"bucket_cap_mb={cap:g} holds the whole model ({nbytes / 2**20:.2f} MB of "
               f"parameters) in one bucket: its allreduce starts only after backward, with no "
               f"overlap; {fix} one smaller than the model, e.g. {nbytes / 4 / 2**20:.2g}")


class AllReduce(Algorithm):
    name = "allreduce"
    Options = AllReduceOptions
    options: AllReduceOptions

    @classmethod
    def check_plan(cls, options: AllReduceOptions, roles: Roles, model: nn.Module,
                   total_steps: int, report: Callable[[str], None], precision: str = "fp32"
                   ) -> None:
        super().check_plan(options, roles, model, total_steps, report, precision)
        warn_one_bucket(options, model, report)
        if precision == "fp16" and options.accumulation_steps > 1:
            raise ConfigError("precision", precision,
                              "fp16's loss scale does not go with accumulation_steps > 1 (each "
                              "micro-batch would need its own check); use bf16, or "
                              "accumulation_steps=1")

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        synchronize_parameters(model, root=0, group=self.comm)  # everyone starts from rank 0's weights
        self.buckets: GradientBuckets | None = None
        self.ready = True
        if self.comm.active or self.options.accumulation_steps > 1:
            params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            self.buckets = GradientBuckets(
                params, self.comm, bucket_bytes=int(self.options.bucket_cap_mb * 2**20),
                wire_dtype=WIRE_DTYPES[self.options.compression],
                accumulation_steps=self.options.accumulation_steps)
            self.buckets.start()
        return model

    def after_backward(self, model: nn.Module) -> None:
        self.ready = self.buckets.after_backward() if self.buckets is not None else True

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.ready:  # the last micro-batch of an accumulation window
            optimizer.step()

    def close(self) -> None:
        if self.buckets is not None:
            self.buckets.close()
            self.buckets = None

    def abort(self) -> None:
        if self.buckets is not None:
            self.buckets.close(finished=False)
            self.buckets = None
