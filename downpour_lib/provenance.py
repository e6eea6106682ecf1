"""Where a result came from: code version, library versions, machine. Stored in every result row."""

from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess
import sys
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def git_sha() -> str:
    """The commit of the checkout downpour_lib was imported from ('+dirty' if its code has edits)."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        # results/ is what a study writes, not code: regenerating it must not mark the runs dirty
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ":(top)", ":(top,exclude)results"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def mpi_version() -> str:
    """The MPI library, if this process runs under an MPI launcher or already uses MPI (a 1-rank
    mpiexec launch and a 1-rank job on MPI cluster engines record the same), else ''."""
    from .launch_env import discover

    if "mpi4py.MPI" not in sys.modules and discover(os.environ).launcher != "mpi":
        return ""
    try:
        from mpi4py import MPI
    except ImportError:
        return ""

    return MPI.Get_library_version().splitlines()[0].strip().rstrip("\x00")


def cpu_model() -> str:
    """The CPU's model name as the OS reports it ('' if it does not)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> dict[str, str | int]:
    """The machine a result was measured on: its host name, its logical cores (all of them, not
    this process's affinity, which a launcher may have narrowed to one core) and its CPU."""
    return {"host": socket.gethostname(), "cores": os.cpu_count() or 1, "cpu_model": cpu_model()}


def environment() -> dict[str, str | int]:
    import torch  # here: a study's driver reads provenance without importing torch to start

    return {
        **machine(),
        "git_sha": git_sha(),
        "torch_version": torch.__version__,
        "mpi_version": mpi_version(),
        "python_version": platform.python_version(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
