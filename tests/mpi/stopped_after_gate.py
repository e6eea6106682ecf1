"""Under mpiexec -n 3: a rank stopped between the gate and MPI's blocking call still ends the job.

The gate (``comm.mpi.liveness.gate``) lets a collective enter MPI's blocking call only once every member
has issued it; but a member may be stopped right after its part of the gate (it was napping in its
own wait when the others' gate completed). The others are then inside a blocking ``MPI_Reduce``,
where no deadline reaches. Rank 2 plays that member: it passes the gate of a broadcast from rank 2
that the others issue, and stops itself (SIGSTOP). Ranks 0 and 1 are then in the broadcast's data
phase: once MPI's blocking ``MPI_Bcast``, where only their watchdogs could end the job (before
those, only the backstop, at the timeout plus 10 s); now a nonblocking one waited on with naps, so
they sleep and give up at the timeout, naming rank 2 and the broadcast.
"""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from downpour_lib.comm import mpi  # noqa: F401 -- registers "mpi"
from downpour_lib.comm.mpi.liveness import gate

TIMEOUT_S = float(sys.argv[1])


def main() -> None:
    dist.init_process_group("mpi", timeout=timedelta(seconds=TIMEOUT_S))
    group = dist.distributed_c10d._get_default_group()  # our MPIProcessGroup itself
    t = torch.ones(1000)
    dist.all_reduce(t)  # the ranks are in step, the heartbeat under way
    assert torch.equal(t, torch.full_like(t, 3.0)), "the allreduce went wrong"
    if dist.get_rank() == 2:
        gate(group._comm, TIMEOUT_S, "broadcast")  # its part of the gate of the others' broadcast
        print("rank 2 passed the gate and stops", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        # Resumed: the launcher, ending the job, sends SIGCONT before SIGTERM. Wait for the latter.
        time.sleep(10 * TIMEOUT_S)
        raise SystemExit("rank 2 was resumed, and the job did not end")
    dist.broadcast(t, src=2)
    raise SystemExit("the job outlived a rank stopped inside a blocking call")


if __name__ == "__main__":
    main()
