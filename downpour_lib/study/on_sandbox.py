"""Runs of a study on the multi-node Slurm sandbox: borrow it or start it, shape its links, give it back.

``accuracy.SandboxNodes`` (the accuracy study and ``model validate``) and
``emulated_sandbox.SandboxLaunch`` (the emulated sweep) launch their runs differently; what they
share is here: a sandbox already running in the directory is used and its links left unshaped on the
way out, one started here is taken down, and the ranks' environment lets MPI run as root.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .core import StudyError


class SandboxUse:
    """The sandbox in ``directory`` (default: the sandbox's own) with ``nodes`` hosts, for the
    length of a ``with`` block. ``options``: further ``SlurmSandbox`` arguments."""

    def __init__(self, directory: str | os.PathLike | None, nodes: int,
                 log: Callable[[str], None] = print, **options: Any) -> None:
        from ..sandbox.slurm import DEFAULT_DIR, SlurmSandbox

        self.sandbox = SlurmSandbox(directory or DEFAULT_DIR, nodes=nodes, **options)
        self.nodes, self.log = nodes, log
        self.started = False
        self.link: str | None = None

    def __enter__(self):
        from ..sandbox.status import SandboxError

        try:
            if not self.sandbox.status().running:
                self.log(f"starting a {self.nodes}-node Slurm sandbox in {self.sandbox.dir}")
                self.started = True
            self.sandbox.up()
        except SandboxError as exc:
            raise StudyError(f"the multi-node sandbox: {exc}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.sandbox.down()
        elif self.link is not None:
            self.sandbox.up(bandwidth="none")  # a sandbox we borrowed: its links as we found them

    def shape(self, link: str) -> None:
        """Every host's link at ``link`` (only when it changes)."""
        if link != self.link:
            self.sandbox.up(bandwidth=link)
            self.link = link

    def env(self) -> dict[str, str]:
        env = self.sandbox.env()
        if os.geteuid() == 0:  # mpi4py's MPI, imported by every rank, refuses root unless told
            env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        return env
