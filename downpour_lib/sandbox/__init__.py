"""Sandboxes for tests and demos: a real one-node Slurm (``downpour sandbox slurm up|status|down``)."""

from .slurm import SlurmSandbox
from .status import SandboxError, SandboxStatus, missing_requirements

__all__ = ["SandboxError", "SandboxStatus", "SlurmSandbox", "missing_requirements"]
