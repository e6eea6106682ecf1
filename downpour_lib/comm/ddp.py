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

from ..records import device_mark
from ..traffic import collective_bytes
from .collectives import Comm, nbytes


@dataclass
class _HookState:
    comm: Comm
    last_launch: float = 0.0
    last_done: float = 0.0


def _metered_allreduce(state: _HookState,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buffer, comm = bucket.buffer(), state.comm
    # DDP needs a Future, which the communicator's Handle is not: the call is made here, in comm/
    comm.count(*collective_bytes("allreduce", nbytes(buffer), comm.size))
    state.last_launch = time.perf_counter()
    tracer = comm.meter.tracer if comm.meter is not None else None
    launched = device_mark(buffer) if tracer is not None else None
    buffer.div_(comm.size)
    future = dist.all_reduce(buffer, group=comm.group, async_op=True).get_future()
    start = state.last_launch

    def finished(fut: torch.futures.Future) -> torch.Tensor:
        state.last_done = time.perf_counter()
        if tracer is not None:  # launch to completion, on its own track
            tracer.launch(f"bucket {bucket.index()} allreduce", start, launched, state.last_done,
                          "buckets", bytes=nbytes(buffer))
        return fut.value()[0]

    return future.then(finished)


class MeteredDDP:
    """Wraps a model in DDP over ``comm``'s group; its meter gets the buckets' bytes as they start
    and, from ``after_backward``, the communication time backward did not hide."""

    def __init__(self, model: nn.Module, comm: Comm, bucket_cap_mb: float = 25.0) -> None:
        device = comm.ctx.device
        device_ids = [device.index] if device.type == "cuda" else None
        self.module = DistributedDataParallel(model, device_ids=device_ids,
                                              bucket_cap_mb=bucket_cap_mb,
                                              process_group=comm.group)
        self.comm = comm
        self.state = _HookState(comm)
        self.module.register_comm_hook(self.state, _metered_allreduce)

    def exposed_comm_s(self) -> float:
        """Seconds from the last bucket's launch to its completion, for the backward just run."""
        exposed = max(0.0, self.state.last_done - self.state.last_launch)
        self.state.last_launch = self.state.last_done = 0.0
        return exposed

    def after_backward(self) -> None:
        """Call after each backward: meters the part of its communication backward did not hide."""
        self.comm.meter.exposed_backward_comm_s += self.exposed_comm_s()
