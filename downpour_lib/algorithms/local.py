"""Plain single-process training: the reference every distributed algorithm is compared against."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import Algorithm


class Local(Algorithm):
    name = "local"

    @classmethod
    def check_world(cls, options: Any, world_size: int) -> None:
        if world_size != 1:
            raise ConfigError("algorithm", "local",
                              f"runs in one process, but this launch has {world_size} ranks; "
                              "use sync_ps or ddp to train on several")

    @classmethod
    def world_size_for(cls, options: Any, workers: int) -> int:
        if workers != 1:
            raise ConfigError("workers", workers, "algorithm 'local' has exactly 1 worker")
        return 1
