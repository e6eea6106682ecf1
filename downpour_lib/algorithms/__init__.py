"""Training algorithms, one module each, behind ``base.Algorithm``; ``ALGORITHMS`` maps name -> class.

Adding an algorithm is one module, its options, one line in ``ALGORITHMS`` and its tests; the
guide's page on extending downpour (docs/extending.md) says what each of them holds.
"""

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
from .diloco import DiLoCo
from .downpour import Downpour
from .dpsgd import DPSGD
from .easgd import EASGD
from .easgd_async import AsyncEASGD
from .local import Local
from .localsgd import LocalSGD
from .osgp import OSGP
from .sgp import SGP
from .slowmo import SlowMo
from .sync_ps import SyncPS

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (Local, SyncPS, DDP, AllReduce, Downpour, SGP, OSGP, DPSGD, ADPSGD,
                              LocalSGD, EASGD, AsyncEASGD, DiLoCo, SlowMo)}


def algorithm_class(name: str) -> type[Algorithm]:
    """The class that runs algorithm ``name``."""
    if name not in ALGORITHMS:
        raise unknown_name("algorithm", name, ALGORITHMS)
    return ALGORITHMS[name]


def make_algorithm(name: str, ctx: DistContext, **options: Any) -> Algorithm:
    """An algorithm for your own training loop: ``make_algorithm("ddp", ctx, bucket_cap_mb=4)``."""
    if name not in ALGORITHMS:
        raise unknown_name("algorithm", name, ALGORITHMS)
    built = build_options(name, ALGORITHMS[name].Options, options)
    return ALGORITHMS[name](built, Comm(ctx))


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmOptions", "Roles", "algorithm_class",
           "make_algorithm"]
