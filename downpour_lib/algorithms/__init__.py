"""Training algorithms, one module each, behind ``base.Algorithm``; ``ALGORITHMS`` maps name -> class."""

from __future__ import annotations

from .base import Algorithm, AlgorithmOptions, Roles
from .ddp import DDP
from .local import Local
from .sync_ps import SyncPS

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (Local, SyncPS, DDP)}

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmOptions", "Roles"]
