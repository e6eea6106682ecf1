"""Under mpiexec -n 3: runtime.init(comm=...) on sub-worlds of one MPI job, one after another.

Job 1: ranks {0, 1} allreduce over their own process group while rank 2 runs a world of one.
Job 2: all three ranks, after runtime.shutdown(), in a new process group. Prints one JSON line per
rank with what each job saw.
"""

import json

import torch
from mpi4py import MPI

from downpour_lib import runtime
from downpour_lib.comm.collectives import Comm

world = MPI.COMM_WORLD
seen = {"world_rank": world.rank}

sub = world.Split(0 if world.rank < 2 else 1, world.rank)
with runtime.session("gloo", "cpu", 60, comm=sub) as ctx:
    tensor = torch.tensor([float(ctx.rank + 1)])
    Comm(ctx).allreduce(tensor)
    seen["job1"] = [ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size, tensor.item(),
                    ctx.backend]
sub.Free()

with runtime.session("gloo", "cpu", 60, comm=world) as ctx:
    tensor = torch.tensor([float(ctx.rank + 1)])
    Comm(ctx).allreduce(tensor)
    seen["job2"] = [ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size, tensor.item(),
                    ctx.backend]
print(json.dumps(seen), flush=True)
