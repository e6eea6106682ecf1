"""Training algorithms, one module each, behind ``base.Algorithm``; ``ALGORITHMS`` maps name -> class."""

from __future__ import annotations

from typing import Any

from ..comm.collectives import Comm
from ..comm.runtime import DistContext
from ..errors import unknown_name
from ..options import build_options
from .adpsgd import ADPSGD
from .allreduce import AllReduce
from .base import Algorithm, AlgorithmOptions, Roles
from .ddp import DDP
from .downpour import Downpour
from .dpsgd import DPSGD
from .local import Local
from .osgp import OSGP
from .sgp import SGP
from .sync_ps import SyncPS

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (Local, SyncPS, DDP, AllReduce, Downpour, SGP, OSGP, DPSGD, ADPSGD)}


def make_algorithm(name: str, ctx: DistContext, **options: Any) -> Algorithm:
    """An algorithm for your own training loop: ``make_algorithm("ddp", ctx, bucket_cap_mb=4)``."""
    if name not in ALGORITHMS:
        raise unknown_name("algorithm", name, ALGORITHMS)
    cls = ALGORITHMS[name]
    opts = build_options(name, cls.Options, options)
    cls.check_world(opts, ctx.world_size)
    return cls(opts, Comm(ctx))


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmOptions", "Roles", "make_algorithm"]
