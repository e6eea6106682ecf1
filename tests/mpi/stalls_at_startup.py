"""Under mpiexec: ``downpour train`` whose rank STOP stops itself (SIGSTOP) as it reaches a
start-up phase, a deterministic stand-in for a rank stalled by a busy node or a debugger.

Arguments: ``STOP PHASE FLAG...``; PHASE is "MPI init" (the rank stops before MPI's
initialization, so the others wait inside ``MPI_Init_thread``) or "the rendezvous" (it stops once
MPI is up, before the process group exists); the flags are ``downpour train``'s. The rank says
"rank R stops at PHASE" on stdout first.
"""

import os
import signal
import sys

STOP, PHASE = int(sys.argv[1]), sys.argv[2]
sys.argv = ["downpour", "train", *sys.argv[3:]]

from downpour_lib import _early, _startup  # noqa: E402

_early.hold(sys.argv[1:])  # what the `downpour` entry point does first: the sentinel starts

from downpour_lib.cli import main  # noqa: E402

_waiting = _startup.waiting


def waiting(phase, timeout_s, rank, size):
    if phase == PHASE and rank == STOP:
        if phase != "MPI init":  # it got there, and stops inside
            _waiting(phase, timeout_s, rank, size)
        print(f"rank {rank} stops at {phase}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    _waiting(phase, timeout_s, rank, size)


_startup.waiting = waiting
sys.exit(main(sys.argv[1:]))
