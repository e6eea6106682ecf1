"""Under mpiexec -n 2: a rank stopped, then resumed as another probes it, is named, not "alive".

When one rank's heartbeat finds a stopped rank and ends the job, the launcher resumes the stopped
process (SIGCONT) before it terminates it; another rank whose own wait ran out at that moment
probed the ranks and got the resumed one's answer, and said "every rank is alive" (a silent-rank
test's flake). Here rank 0 stops itself; rank 1 resumes it after ``STOP_S`` and at once explains a
wait of ``WAITED_S`` the way a timed-out wait does (``liveness.explain``), printing the result as
one JSON line. The timeout is long, so no heartbeat gives its verdict first.
"""

import json
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from mpi4py import MPI

from downpour_lib.comm import mpi  # noqa: F401 -- registers "mpi"
from downpour_lib.comm.mpi.liveness import PeerTimeout, explain

STOP_S, WAITED_S = 4.0, 6.0


def main() -> None:
    dist.init_process_group("mpi", timeout=timedelta(seconds=60))
    pids = MPI.COMM_WORLD.allgather(os.getpid())
    t = torch.ones(4)
    dist.all_reduce(t)  # in step, the heartbeat under way
    if dist.get_rank() == 0:
        print("rank 0 stops", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        time.sleep(STOP_S)
        os.kill(pids[0], signal.SIGCONT)
        error = explain(PeerTimeout("allreduce", WAITED_S), "default group")
        print(json.dumps({"message": str(error), "silent": error.silent,
                          "states": error.states}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
