"""What the Slurm sandbox (``slurm``) needs of this machine, and what it reports: its status.

``missing_requirements`` says what this machine lacks (the programs, root); ``SandboxStatus`` is
what ``SlurmSandbox.status`` finds (daemons, nodes, jobs), printed by ``downpour sandbox slurm
status``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DownpourError

SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
REQUIRED = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "squeue", "scancel")


class SandboxError(DownpourError):
    """The sandbox cannot start here, or a daemon failed (the message holds its log's tail)."""


def missing_requirements() -> list[str]:
    """What this machine lacks to run the sandbox (empty when it can)."""
    missing = [f"`{exe}` (apt-get install slurm-wlm munge)" for exe in REQUIRED
               if shutil.which(exe) is None]
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        missing.append("root: slurmd and the munge key are run and owned by root")
    return missing


def pmix_available() -> bool:
    """Can Slurm's mpi/pmix plugin load libpmix (Debian: apt-get install libpmix-dev)?"""
    try:
        ctypes.CDLL("libpmix.so")
    except OSError:
        return False
    return True

@dataclass(frozen=True)
class NodeStatus:
    name: str
    address: str
    state: str  # Slurm's, e.g. "idle"; "" when slurmctld does not answer
    shaping: str = "none"  # the link's rate, e.g. "100Mbit"
    tcp: str = ""  # the congestion control of its TCP (netns.CONGESTION_CONTROL)

    def __str__(self) -> str:
        return (f"{self.name:<8} {self.address:<13} {self.state or '?':<10} link {self.shaping}"
                + (f", tcp {self.tcp}" if self.tcp else ""))


@dataclass
class SandboxStatus:
    directory: Path
    conf: Path
    daemons: dict[str, int | None]  # name -> pid when running
    node: str = ""  # e.g. "vm idle" (one node; several: one line each)
    nodes: list[NodeStatus] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    pmix: bool = False
    system_link: bool = False

    @property
    def running(self) -> bool:
        return all(self.daemons.values())

    @property
    def stopped(self) -> bool:
        return not any(self.daemons.values())

    def __str__(self) -> str:
        lines = [f"slurm sandbox in {self.directory}: "
                 + ("up" if self.running else "down" if self.stopped else "partly up")]
        lines += [f"  {name:<10} " + (f"pid {pid}" if pid else "not running")
                  for name, pid in self.daemons.items()]
        if len(self.nodes) > 1:
            lines += [f"  node       {n}" for n in self.nodes]
            if not self.running and any(self.daemons.values()):
                lines.append("  `downpour sandbox slurm up` starts what is not running")
        elif self.running:
            lines.append(f"  node       {self.node}")
        if self.running:
            lines.append(f"  jobs       {len(self.jobs)}" + "".join(f"\n    {j}" for j in self.jobs))
            lines.append("  srun --mpi=pmix " + ("works" if self.pmix else
                                                 "unavailable (apt-get install libpmix-dev)"))
            link = f" (also linked from {SYSTEM_CONF})" if self.system_link else ""
            lines.append(f"  export SLURM_CONF={self.conf}{link}")
        return "\n".join(lines)
