"""Sandboxes for tests and demos: a real one-node Slurm (``downpour sandbox slurm up|status|down``)."""

from .slurm import SandboxError, SandboxStatus, SlurmSandbox, missing_requirements

__all__ = ["SandboxError", "SandboxStatus", "SlurmSandbox", "missing_requirements"]
