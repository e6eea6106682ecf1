"""PyTorch DistributedDataParallel, with a communication hook that meters what it does.

The hook is DDP's default allreduce (average of gradients) plus two timestamps per bucket: when its
allreduce was launched and when it finished. The last bucket is launched when backward's compute ends,
so the time from its launch to its completion is the communication backward could not hide.
(No ``from __future__ import annotations`` here: DDP checks the hook's annotations at run time.)
"""

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..records import Meter
from .collectives import nbytes
from .runtime import DistContext


@dataclass
class _HookState:
    meter: Meter
    world_size: int
    last_launch: float = 0.0
    last_done: float = 0.0


def _metered_allreduce(state: _HookState,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    moved = 2 * (state.world_size - 1) * nbytes(buffer) // state.world_size
    state.meter.count(sent=moved, received=moved)
    state.last_launch = time.perf_counter()
    buffer.div_(state.world_size)
    future = dist.all_reduce(buffer, async_op=True).get_future()

    def finished(fut: torch.futures.Future) -> torch.Tensor:
        state.last_done = time.perf_counter()
        return fut.value()[0]

    return future.then(finished)


class MeteredDDP:
    """Wraps a model in DDP and reports, after each backward, the exposed communication time."""

    def __init__(self, model: nn.Module, ctx: DistContext, meter: Meter,
                 bucket_cap_mb: float = 25.0) -> None:
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.module = DistributedDataParallel(model, device_ids=device_ids,
                                              bucket_cap_mb=bucket_cap_mb)
        self.state = _HookState(meter, ctx.world_size)
        self.module.register_comm_hook(self.state, _metered_allreduce)

    def exposed_comm_s(self) -> float:
        """Seconds from the last bucket's launch to its completion, for the backward just run."""
        exposed = max(0.0, self.state.last_done - self.state.last_launch)
        self.state.last_launch = self.state.last_done = 0.0
        return exposed
