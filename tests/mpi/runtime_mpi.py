"""Under mpiexec -n 2: runtime.init("auto") picks the mpi backend on CPU, and training on it equals
one process on the 2x batch (the same references as equivalence.py, now with MPI as the default group).
"""

import json
import sys

import torch
import torch.distributed as dist
from equivalence import BASE, B
from reference import compare, one_process, trained

from downpour_lib import TrainConfig, runtime
from downpour_lib.comm.collectives import Comm


def main() -> int:
    ctx = runtime.init(backend="auto", device="cpu", timeout_s=120)
    assert (ctx.backend, dist.get_backend(), ctx.world_size) == ("mpi", "mpi", 2), ctx
    gathered = Comm(ctx).gather_object({"rank": ctx.rank}, root=1)  # object collectives work too
    assert gathered is None or gathered == [{"rank": 0}, {"rank": 1}], gathered
    failed = False
    base = {**BASE, "backend": "mpi"}
    for name, change in [("ddp", dict(algorithm="ddp")),
                         ("sync_ps colocated", dict(algorithm="sync_ps",
                                                    options={"server": "colocated"}))]:
        _, dist_params, _ = trained(TrainConfig(**base, **change, batch_size=B), ctx)
        initial, ref = one_process(base, 2 * B)
        result = compare(dist_params, ref, initial)
        failed |= result["max_abs_diff"] > 1e-5
        if ctx.rank == 0:
            print(json.dumps({"case": name, "backend": ctx.backend, "max_abs_diff":
                              result["max_abs_diff"], "reference_moved": result["reference_moved"]}),
                  flush=True)
    flag = torch.tensor([int(failed)])
    dist.all_reduce(flag)
    runtime.shutdown()
    return 1 if int(flag) else 0


if __name__ == "__main__":
    sys.exit(main())
