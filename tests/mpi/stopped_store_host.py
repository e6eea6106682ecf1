"""Under mpiexec -n N: rank 0, the host of the rendezvous store (a gloo group's), stops itself
(SIGSTOP) once it has told the others where the store is, so that they connect to a server the
kernel still accepts connections for but that never answers. Each waiting rank prints one JSON
line when ``runtime.init`` gives up (``argv[1]``: its start-up deadline): its process's CPU seconds per wall
second over the wait, and the error; then it exits non-zero, ending the job.
"""

import json
import os
import signal
import sys
import time

from mpi4py import MPI

from downpour_lib.comm import runtime

TIMEOUT_S = float(sys.argv[1])


class StopsOnceTold:
    """COMM_WORLD, whose rank 0 stops right after its broadcast (the store's address)."""

    def __init__(self, comm) -> None:
        self._comm = comm

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def bcast(self, obj, root=0):
        obj = self._comm.bcast(obj, root=root)
        if self._comm.Get_rank() == 0:
            print("rank 0 stops", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(10 * TIMEOUT_S)  # resumed by the launcher ending the job
            raise SystemExit("rank 0 was resumed, and the job did not end")
        return obj


def main() -> None:
    rank = MPI.COMM_WORLD.Get_rank()
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        runtime.init(backend="gloo", device="cpu", timeout_s=TIMEOUT_S,
                     comm=StopsOnceTold(MPI.COMM_WORLD), startup_timeout_s=TIMEOUT_S)
    except RuntimeError as exc:
        wall = time.perf_counter() - wall
        print(json.dumps({"rank": rank, "cpu_share": (time.process_time() - cpu) / wall,
                          "wall_s": wall, "error": str(exc)}), flush=True)
        sys.stdout.flush()
        os._exit(1)  # the connect's thread is still inside torch
    raise SystemExit(f"rank {rank}: the rendezvous ended without the store's host")


if __name__ == "__main__":
    main()
