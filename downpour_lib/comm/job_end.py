"""How a failing rank ends an MPI job: one clean line first, the details in a log, then the end.

A failing job used to print its one-line message followed by two or three tracebacks of different
ranks interleaved, Open MPI's MPI_ABORT banner and a NUL byte (prterun writes one after the banner
it prints when a rank calls ``MPI_Abort``). Now each failing rank writes one line to stderr,
``downpour: rank R of N failed: <what>``, naming the file that holds its traceback, and ends the
job: under Open MPI's own launcher (``mpiexec``/``prterun``) by exiting non-zero, which makes
prterun end every other rank (a stopped one too) with a short notice and no NUL byte; under any
other launcher (srun, MPICH's hydra) by ``MPI_Abort``, the one way every MPI promises. Imports
nothing but the standard library: the watchdog thread of the ``mpi`` backend calls it too.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
import traceback
from typing import NoReturn


def log_path(rank: int) -> str:
    """Where rank ``rank`` of this job writes the details of its failure."""
    job = os.environ.get("PMIX_NAMESPACE") or os.environ.get("SLURM_JOB_ID") or str(os.getppid())
    job = re.sub(r"[^A-Za-z0-9_.-]", "_", job)
    return os.path.join(tempfile.gettempdir(), f"downpour-{job}-rank{rank}.log")


def report(rank: int, size: int, what: str, exc: BaseException | None = None) -> None:
    """``downpour: rank R of N failed: <what>`` on stderr, as one line written at once; the
    traceback of ``exc`` goes to ``log_path`` (which the line names)."""
    line = f"downpour: rank {rank} of {size} failed: {what}"
    if exc is not None:
        path = log_path(rank)
        try:
            with open(path, "w") as log:
                log.write(line + "\n")
                traceback.print_exception(exc, file=log)
            line += f" (traceback: {path} on {socket.gethostname()})"
        except OSError as err:  # no log: the traceback follows the line instead
            line += f" (no log at {path}: {err})\n" + "".join(traceback.format_exception(exc))
    err = sys.__stderr__ or sys.stderr  # torch may have redirected sys.stderr around a hook
    err.write(line + "\n")
    err.flush()


def end_job(code: int, comm=None) -> NoReturn:
    """End this rank and the whole job with exit status ``code``. ``comm``: an mpi4py communicator
    spanning the job, for ``MPI_Abort`` where the launcher is not Open MPI's."""
    if comm is not None and not os.environ.get("PRTE_LAUNCHED"):
        comm.Abort(code)
    os._exit(code)  # prterun sees a non-zero exit and ends every other rank
