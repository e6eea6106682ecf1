"""Under mpiexec -n 2: a rank whose asynchronous allreduce waits for a late peer does not burn CPU.

Rank 1 computes for a while before it joins; rank 0 starts the allreduce at once with async_op=True
(as DDP's buckets and the allreduce algorithm do) and sleeps in ``wait()``. The CPU time rank 0's
process spends meanwhile is what its communication thread takes from its own backward pass.
For the shared-memory path (64 KB and 4 MB) and, for comparison, MPI's own allreduce (1 KB; Open MPI
spins while it waits). Rank 0 prints one JSON line: size -> CPU seconds per wall second.
"""

import json
import time

import torch
import torch.distributed as dist
from mpi4py import MPI

from downpour_lib.comm import mpi_backend  # noqa: F401 -- registers "mpi"

LATE_S = 0.6


def cpu_share_while_waiting(numel: int) -> float:
    rank = dist.get_rank()
    t = torch.full((numel,), float(rank + 1))
    dist.all_reduce(t)  # sets the shared-memory buffer up
    MPI.COMM_WORLD.Barrier()
    start_cpu, start = time.process_time(), time.perf_counter()
    if rank == 1:
        while time.perf_counter() - start < LATE_S:  # "backward"
            pass
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    share = (time.process_time() - start_cpu) / (time.perf_counter() - start)
    t.fill_(rank + 1)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full_like(t, 3.0)), "the allreduce itself went wrong"
    return share


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("mpi")
    shares = {str(n * 4): cpu_share_while_waiting(n) for n in (256, 16384, 1 << 20)}
    if dist.get_rank() == 0:
        print(json.dumps(shares), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
