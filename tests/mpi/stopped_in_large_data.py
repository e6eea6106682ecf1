"""Under mpiexec -n 3: ranks waiting on a stopped peer in a large collective sleep, and name it.

sync_ps's shape: a reduce to rank 0 and a broadcast from it, here of ``argv[4]`` bytes (above the
256 KB where the backend used to call MPI's blocking, spinning forms); or an allgather, or an
allreduce, or a reduce_scatter, or an allgather of uneven sizes. After one such operation in step
(which also sets up what it needs), rank ``argv[3]`` stops itself (SIGSTOP) and the others issue
the next. With ``argv[5]``
``after-gate``, it first takes its part in the others' gate (``comm/mpi/liveness.gate``: the
``MPI_Ibarrier`` before the data phase of the paths that have one), so that they find it missing
inside the data phase itself. Each waiting rank prints one JSON line when its wait ends: its
process's CPU seconds per wall second over the wait, and the error it got; then it re-raises,
ending the job. A waiting rank inside MPI's blocking call (a 4 MB MAX allreduce at 2 ranks, after
the gate, whose second call is the short path's) prints none: its watchdog ends the job, naming the
stopped rank on stderr.
"""

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from downpour_lib.comm import mpi  # noqa: F401 -- registers "mpi"
from downpour_lib.comm.mpi.liveness import CommTimeout

TIMEOUT_S, OP, SILENT, NBYTES = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
AFTER_GATE = sys.argv[5:] == ["after-gate"]


def operate(t: torch.Tensor) -> None:
    if OP == "reduce":
        dist.reduce(t, dst=0)
    elif OP == "broadcast":
        dist.broadcast(t, src=0)
    elif OP == "allreduce":
        dist.all_reduce(t)
    elif OP == "allreduce_max":  # MPI's path, not shared memory's: the C data phase's short path
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    elif OP == "reduce_scatter":
        dist.reduce_scatter_tensor(torch.empty(t.numel() // dist.get_world_size()), t)
    elif OP == "all_gather_uneven":  # rank r gives 1024 r elements fewer: MPI's allgatherv
        sizes = [t.numel() - 1024 * r for r in range(dist.get_world_size())]
        outputs = [torch.empty(size) for size in sizes]
        dist.all_gather(outputs, t[:sizes[dist.get_rank()]])
        assert all(torch.equal(o, torch.full_like(o, r + 1.0)) for r, o in enumerate(outputs))
    else:
        out = torch.empty(t.numel() * dist.get_world_size())
        dist.all_gather_into_tensor(out, t)


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("mpi", timeout=timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    t = torch.full((NBYTES // 4,), float(rank + 1))
    operate(t)
    if OP == "reduce" and rank == 0:
        assert torch.equal(t, torch.full_like(t, 6.0)), "the reduce went wrong"
    if rank == SILENT:
        if AFTER_GATE:  # the others' gate: the group's data communicator's barrier
            dist.distributed_c10d._get_default_group()._comm.Ibarrier().Wait()
        print(f"rank {rank} stops", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(10 * TIMEOUT_S)  # resumed by the launcher ending the job: wait for its SIGTERM
        raise SystemExit(f"rank {rank} was resumed, and the job did not end")
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        operate(t)
    except CommTimeout as exc:
        wall = time.perf_counter() - wall
        print(json.dumps({"rank": rank, "cpu_share": (time.process_time() - cpu) / wall,
                          "wall_s": wall, "error": str(exc)}), flush=True)
        raise
    raise SystemExit(f"rank {rank}: {OP} ended without the stopped rank")


if __name__ == "__main__":
    main()
