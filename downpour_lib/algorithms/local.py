"""Plain single-process training: the reference every distributed algorithm is compared against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError
from .base import Algorithm, AlgorithmOptions, Roles


@dataclass(frozen=True)
class LocalOptions(AlgorithmOptions):
    """No options; one process, one worker."""

    traffic: ClassVar[str] = "none"  # for the performance model: no communication

    def roles(self, world_size: int) -> Roles:
        if world_size != 1:
            raise ConfigError("algorithm", "local",
                              f"runs in one process, but this launch has {world_size} ranks; "
                              "use sync_ps or ddp to train on several")
        return super().roles(1)

    def roles_for(self, workers: int) -> Roles:
        if workers != 1:
            raise ConfigError("workers", workers, "algorithm 'local' has exactly 1 worker")
        return self.roles(1)


class Local(Algorithm):
    name = "local"
    Options = LocalOptions
