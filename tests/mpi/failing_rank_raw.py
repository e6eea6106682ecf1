"""Under mpiexec -n 3: plain torch.distributed on the mpi backend, no downpour launch helpers.

Rank 1 raises an exception nobody catches while ranks 0 and 2 wait in an MPI allreduce (no timeout):
the backend's hook must abort the MPI job and name the rank.
"""

import torch
import torch.distributed as dist

import downpour_lib.comm.mpi  # noqa: F401 -- registers "mpi" on the stock torch wheel

dist.init_process_group("mpi")
t = torch.ones(1000)
for step in range(10**9):
    if dist.get_rank() == 1 and step == 3:
        raise RuntimeError("injected failure for the test")
    t.fill_(1.0)
    dist.all_reduce(t)
