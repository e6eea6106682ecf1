"""The preemption vote's side channel: a group of every rank that carries the votes alone
(``preempt.StepVote`` and the end-of-run verdict), apart from the algorithm's own traffic.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .collectives import Communicator
from .runtime import DistContext


class Control:
    """Every rank, for the votes alone, so they never interleave with an algorithm's own
    collectives (threads, DDP's hooks): a gloo group (its own thread completes a vote while the
    rank computes), or under the ``mpi`` backend a duplicate of its MPI communicator, on which a
    vote is MPI's nonblocking allreduce (the backend's queued collectives would keep its one thread
    spinning in a blocking allreduce for a whole step: half the throughput of a small model)."""

    def __init__(self, ctx: DistContext) -> None:
        self.group: Communicator | None = None
        self.mpi, self.timeout_s = None, ctx.timeout_s
        if ctx.backend == "mpi":
            from .mpi import backend

            self.mpi = backend.world().Dup()  # collective: every rank, same order
        else:  # torch cannot add a gloo group to an MPI world, but can to any other
            from .groups import new_group

            self.group = new_group(range(ctx.world_size), backend="gloo")

    def start(self, values: list[float]) -> Callable[[], torch.Tensor]:
        """A MAX allreduce of ``values`` started now; call the result to wait for it."""
        flags = torch.tensor(values, dtype=torch.float64)
        if self.mpi is not None:
            from mpi4py import MPI

            from .mpi.liveness import wait_request

            out = torch.empty_like(flags)
            request = self.mpi.Iallreduce(flags.numpy(), out.numpy(), op=MPI.MAX)
            # the job's timeout, and the heartbeat's word on a silent rank, as every MPI wait here;
            # the closure holds both buffers until MPI is done with them
            return lambda: (wait_request(request, self.timeout_s, "the preemption vote"),
                            flags, out)[2]
        work = self.group.allreduce(flags, op="max", async_op=True, account=None)
        return lambda: (work.wait(), flags)[1]

    def vote(self, values: list[float]) -> torch.Tensor:
        return self.start(values)()

    def close(self) -> None:
        if self.mpi is not None:
            self.mpi.Free()
            self.mpi = None


def control_group(ctx: DistContext) -> Control | None:
    """The votes' ``Control``, None in a world of one. Collective: every rank, same order."""
    return Control(ctx) if ctx.world_size > 1 else None
