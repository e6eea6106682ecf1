"""Under mpiexec -n 3: a rank stopped while the others are in a broadcast's data phase ends the job.

The others' broadcast (small: MPI's nonblocking one, with no gate before it) waits on rank 2, which
stops itself (SIGSTOP) instead of issuing it. Before, a gate (``MPI_Ibarrier``) came first and the
data phase was MPI's blocking ``MPI_Bcast``, where a member stopped after its part of the gate left
the others spinning until the watchdog or the backstop (the timeout plus 10 s) ended the job; now
the data phase is waited on with naps and the same deadline, so they sleep and give up at the
timeout, naming rank 2 and the broadcast.
"""

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from downpour_lib.comm import mpi  # noqa: F401 -- registers "mpi"

TIMEOUT_S = float(sys.argv[1])


def main() -> None:
    dist.init_process_group("mpi", timeout=timedelta(seconds=TIMEOUT_S))
    t = torch.ones(1000)
    dist.all_reduce(t)  # the ranks are in step, the heartbeat under way
    assert torch.equal(t, torch.full_like(t, 3.0)), "the allreduce went wrong"
    if dist.get_rank() == 2:
        print("rank 2 stops", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        # Resumed: the launcher, ending the job, sends SIGCONT before SIGTERM. Wait for the latter.
        time.sleep(10 * TIMEOUT_S)
        raise SystemExit("rank 2 was resumed, and the job did not end")
    dist.broadcast(t, src=2)
    raise SystemExit("the job outlived a rank stopped inside a blocking call")


if __name__ == "__main__":
    main()
