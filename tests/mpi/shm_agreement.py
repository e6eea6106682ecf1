"""Under mpiexec -n 2: ranks that do not all have the C steps agree on the Python ones.

Rank 1 runs with DOWNPOUR_MPI_NATIVE=0 (as a node without a C compiler would), rank 0 with the C
data phase built. Where every rank has the shared-memory steps in C, ``paths.TABLE_C`` sends a 4 KB
allreduce to shared memory, where the Python table sends it to MPI: had each rank chosen by what
it has alone, rank 0 would wait in a shared-memory barrier while rank 1 waits in MPI, until the
timeout. The group agrees when it sets the shared memory up (``ShmAllreduce._setup``), so both take
the Python table. Each rank prints one JSON line: what it has, what the group agreed, the paths it
took, and whether every result was right.
"""

import json
import os
import sys
from datetime import timedelta

if (os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMIX_RANK")) == "1":
    os.environ["DOWNPOUR_MPI_NATIVE"] = "0"  # before the backend loads it

import torch
import torch.distributed as dist

from downpour_lib.comm import mpi  # noqa: F401 -- registers "mpi"
from downpour_lib.comm.mpi import native


def main() -> int:
    dist.init_process_group("mpi", timeout=timedelta(seconds=20))
    rank, n = dist.get_rank(), dist.get_world_size()
    right = True
    for numel in (1, 1 << 10, 1 << 14, 1 << 18, 1 << 20):
        t = torch.full((numel,), float(rank + 1))
        dist.all_reduce(t)
        right &= bool(t.eq(n * (n + 1) / 2).all())
        b = torch.full((numel,), float(rank))
        dist.broadcast(b, src=1)
        right &= bool(b.eq(1).all())
        out = torch.empty(n * numel)
        dist.all_gather_into_tensor(out, torch.full((numel,), float(rank)))
        right &= torch.equal(out, torch.arange(n, dtype=out.dtype).repeat_interleave(numel))
    pg = dist.distributed_c10d._get_default_group()
    print(json.dumps({"rank": rank, "has_c": native.load() is not None,
                      "shm_set_up": pg._shm._ready is True, "shm_in_c": pg._shm.in_c,
                      "paths": sorted({route.path for route in pg._router.routes.values()}),
                      "right": right}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
