"""Where am I? Rank, world size and local rank from whatever launched this process.

Pure functions of an environment mapping (no torch.distributed, no MPI calls), so every launcher's
conventions are unit-tested without the launcher. The order follows DESIGN.md, with one refinement:
torchrun is checked first because it is always the innermost launcher (torchrun inside an sbatch job
still sees the job's SLURM_* variables, which describe the batch step, not the workers).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Launcher = Literal["single", "torchrun", "mpi", "slurm", "env"]


@dataclass(frozen=True)
class Placement:
    """This process's place in the job, as the launcher describes it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launcher: Launcher


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return int(value)
    return None


def discover(env: Mapping[str, str]) -> Placement:
    """Read the launcher's variables. Without any, this is a single process."""
    if "TORCHELASTIC_RUN_ID" in env and "RANK" in env:
        return _from_rank_variables(env, "torchrun")
    # Open MPI (and PRRTE), then MPICH's Hydra, then a bare PMIx launch such as `srun --mpi=pmix`.
    rank = _int(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
    size = _int(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")
    if rank is not None and size is not None:
        local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
        local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
        if local_size is None:
            local_size = slurm_local_size(env)
        return Placement(rank, size, local_rank or 0, local_size or 1, "mpi")
    # srun sets SLURM_STEP_NUM_TASKS only inside a job step; a batch script alone is one process.
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:
        return Placement(
            rank=int(env["SLURM_PROCID"]),
            world_size=int(env["SLURM_STEP_NUM_TASKS"]),
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            local_world_size=slurm_local_size(env) or 1,
            launcher="slurm",
        )
    if "RANK" in env and "WORLD_SIZE" in env:
        return _from_rank_variables(env, "env")
    return Placement(0, 1, 0, 1, "single")


def _from_rank_variables(env: Mapping[str, str], launcher: Launcher) -> Placement:
    """RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, as torchrun sets them (and env://)."""
    return Placement(rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                     local_rank=int(env.get("LOCAL_RANK", 0)),
                     local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)), launcher=launcher)


def slurm_local_size(env: Mapping[str, str]) -> int | None:
    """Tasks on this node from SLURM_STEP_TASKS_PER_NODE (e.g. ``2(x3),1``) and SLURM_NODEID."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return None
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    node = int(env.get("SLURM_NODEID", 0))
    return counts[node] if node < len(counts) else None


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm host list: ``gpu[01-03,07],login`` -> gpu01 gpu02 gpu03 gpu07 login."""
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            hosts.append(plain)
            continue
        for item in ranges.split(","):
            lo, _, hi = item.partition("-")
            if not hi:
                hosts.append(prefix + lo)
                continue
            width = len(lo)
            hosts += [f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
    return hosts


#: where an srun step's store listens: below the kernel's ephemeral range (ip_local_port_range)
RENDEZVOUS_PORTS = range(20000, 32000)


def slurm_rendezvous(env: Mapping[str, str]) -> tuple[str, int]:
    """Master address and port for an srun step without MPI.

    The first host of the step runs the store. The port is derived from the job and step ids so
    that two steps of one job (or two jobs sharing a node) do not collide, and lies below Linux's
    ephemeral ports (32768-60999 by default), which any outgoing connection on the node may hold:
    job 3's 34075 once failed to listen (EADDRINUSE) beside make test's other connections.
    MASTER_ADDR/MASTER_PORT, when the user sets them, win.
    """
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "localhost"
    addr = env.get("MASTER_ADDR") or expand_nodelist(nodelist)[0]
    if env.get("MASTER_PORT"):
        return addr, int(env["MASTER_PORT"])
    key = f"{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}".encode()
    return addr, RENDEZVOUS_PORTS.start + zlib.crc32(key) % len(RENDEZVOUS_PORTS)
