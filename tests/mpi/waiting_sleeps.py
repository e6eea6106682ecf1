"""Under mpiexec -n 2: a rank whose asynchronous allreduce waits for a late peer does not burn CPU.

Rank 1 computes for a while before it joins; rank 0 starts the allreduce at once with async_op=True
(as DDP's buckets and the allreduce algorithm do) and sleeps in ``wait()``. The CPU time rank 0's
process spends meanwhile is what its communication thread takes from its own backward pass.
For the shared-memory path (64 KB and 4 MB), MPI's own allreduce (1 KB: Open MPI would spin in it,
so the backend first waits at a polled gate), a broadcast and a receive. Rank 0 prints one JSON
line: case -> CPU seconds per wall second.
"""

import json
import time

import torch
import torch.distributed as dist
from mpi4py import MPI

from downpour_lib.comm import mpi  # noqa: F401 -- registers "mpi"

LATE_S = 0.6


def cpu_share_while_waiting(op, t: torch.Tensor) -> float:
    """Rank 0's CPU seconds per wall second while ``op(t)`` waits for rank 1, late by LATE_S."""
    op(t)  # sets up what the operation needs (the shared-memory buffer)
    MPI.COMM_WORLD.Barrier()
    start_cpu, start = time.process_time(), time.perf_counter()
    if dist.get_rank() == 1:
        while time.perf_counter() - start < LATE_S:  # "backward"
            pass
    op(t)
    return (time.process_time() - start_cpu) / (time.perf_counter() - start)


def allreduce(t: torch.Tensor) -> None:
    t.fill_(dist.get_rank() + 1)
    dist.all_reduce(t, async_op=True).wait()
    assert torch.equal(t, torch.full_like(t, 3.0)), "the allreduce itself went wrong"


def broadcast(t: torch.Tensor) -> None:
    t.fill_(dist.get_rank() + 1)
    dist.broadcast(t, src=1)
    assert torch.equal(t, torch.full_like(t, 2.0)), "the broadcast itself went wrong"


def send_recv(t: torch.Tensor) -> None:
    if dist.get_rank() == 0:
        dist.recv(t, src=1)
        assert torch.equal(t, torch.full_like(t, 7.0)), "the message itself went wrong"
    else:
        dist.send(torch.full_like(t, 7.0), dst=0)


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("mpi")
    shares = {f"allreduce {n * 4}": cpu_share_while_waiting(allreduce, torch.zeros(n))
              for n in (256, 16384, 1 << 20)}
    shares["broadcast 65536"] = cpu_share_while_waiting(broadcast, torch.zeros(16384))
    shares["recv 65536"] = cpu_share_while_waiting(send_recv, torch.zeros(16384))
    if dist.get_rank() == 0:
        print(json.dumps(shares), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
