"""What the Slurm tests share (tests/test_slurm.py: one node; tests/test_slurm_nodes.py: two): the
sandbox as a module fixture, the run they train, and reading the queue."""

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import explain

from downpour_lib.sandbox import SlurmSandbox, missing_requirements
from downpour_lib.sandbox.netns import Network, NetworkError

REQUIRED = os.environ.get("DOWNPOUR_REQUIRE_SLURM") == "1"
TINY = {"algorithm": "sync_ps", "model": "mlp", "dataset": "digits", "steps": 12, "batch_size": 16,
        "threads": 1, "warmup_steps": 2}
FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]


def unavailable(reason: str) -> None:
    """Skip, except under DOWNPOUR_REQUIRE_SLURM=1 (CI), where a skip would hide a broken launch path."""
    if REQUIRED:
        pytest.fail(f"DOWNPOUR_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def running_sandbox(directory, nodes: int = 1):
    """A sandbox of ``nodes`` nodes in ``directory``, up for the block and down after it."""
    missing = missing_requirements()
    if missing:
        unavailable("the Slurm sandbox needs " + "; ".join(missing))
    if nodes > 1:
        try:
            Network.check()
        except NetworkError as exc:
            unavailable(str(exc))
    box = SlurmSandbox(directory, link_system_conf=False, nodes=nodes)
    try:
        box.up()
        yield box
    finally:
        box.down()


def squeue(env, fields: str = "%j %T") -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", fields], env=env, capture_output=True, text=True,
                         timeout=30)
    return out.stdout.split("\n")[:-1]


def job_state(env, job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True,
                         text=True, timeout=30).stdout
    return next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")


BATCH = Path(__file__).resolve().parents[1] / "cluster_profiles" / "launch_multinode.sbatch"
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def submit_batch(env, output: Path, nodes: int, per_node: int, *sbatch: str, script: Path = BATCH,
                 **variables: str) -> str:
    """Submit cluster_profiles/launch_multinode.sbatch (or ``script``) with these DOWNPOUR_*
    ``variables`` (the checkpoints beside ``output`` unless given); its job id. ``sbatch`` options
    go first."""
    variables.setdefault("DOWNPOUR_CHECKPOINTS", str(output.with_suffix(".ckpt")))
    proc = subprocess.run(["sbatch", "--parsable", f"--nodes={nodes}", f"--ntasks-per-node={per_node}",
                           f"--output={output}", *sbatch, str(script)], env={**env, **variables},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, explain(proc)
    return proc.stdout.strip().split(";")[0]


def wait_for_jobs(env, jobs: dict[str, str], timeout_s: float) -> dict[str, str]:
    """Poll (``sbatch --wait`` polls for tens of seconds) until every job ended; their states."""
    deadline, states = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        states = {name: job_state(env, job) for name, job in jobs.items()}
        if all(state in ENDED for state in states.values()):
            break
        time.sleep(0.5)
    return states


def job_processes(job: str, ranks_only: bool = False, node: str | None = None) -> list[int]:
    """The live processes of Slurm job ``job`` (only its training ranks; only those on ``node``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        environ = process_environ(pid)
        if state == "Z" or f"SLURM_JOB_ID={job}".encode() not in environ:
            continue
        if ranks_only and not is_rank(pid):
            continue
        if node is not None and f"SLURMD_NODENAME={node}".encode() not in environ:
            continue
        found.append(int(pid))
    return found


def is_rank(pid: str) -> bool:
    """A training rank: the console script (not its launcher), neither the batch script's
    pre-flight (``downpour train --preflight``) nor a rank's start-up sentinel (a fork of it)."""
    if process_comm(pid) != "downpour":
        return False
    try:
        if b"--preflight" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
            return False
        parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except OSError:
        return False
    return process_comm(parent) != "downpour"


def process_environ(pid: str) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def process_comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
