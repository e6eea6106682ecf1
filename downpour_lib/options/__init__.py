"""Every algorithm's options, and the plumbing below them and the run config, without torch.

``OPTIONS`` maps each algorithm's name to its options class: a frozen dataclass, one help text per
field, validated with ``ConfigError``, which also says where the ranks go (``roles``), how they stop
and what the algorithm sends (``traffic``, for the performance model). The run config, the command
line, the studies' plans and the performance model read them here, so that none of them imports
torch (seconds for each process: ``downpour model``, a notebook's kernel); the algorithms
themselves (``downpour_lib.algorithms``, which do) take their ``Options`` from here.

``base`` holds the base class and the turning of typed values into a field's type; the others
hold one family of algorithms each: ``collective``, ``servers``, ``gossip``, ``periodic``.
"""

from .base import AlgorithmOptions, Roles, build_options, check_workers, coerce, field_help, parse
from .collective import AllReduceOptions, DDPOptions, LocalOptions
from .gossip import (
    ADPSGDOptions,
    BoundedLagOptions,
    DPSGDOptions,
    GraphOptions,
    OSGPOptions,
    PushSumOptions,
    SGPOptions,
)
from .periodic import (
    AsyncEASGDOptions,
    DiLoCoOptions,
    EASGDOptions,
    ElasticOptions,
    LocalSGDOptions,
    PeriodicOptions,
    SlowMoOptions,
)
from .servers import DownpourOptions, PSOptions, SyncPSOptions

#: algorithm name -> its options class; ``algorithms.ALGORITHMS`` has the same names, in this order
OPTIONS: dict[str, type[AlgorithmOptions]] = {
    "local": LocalOptions, "sync_ps": SyncPSOptions, "ddp": DDPOptions, "allreduce": AllReduceOptions,
    "downpour": DownpourOptions, "sgp": SGPOptions, "osgp": OSGPOptions, "dpsgd": DPSGDOptions,
    "adpsgd": ADPSGDOptions, "localsgd": LocalSGDOptions, "easgd": EASGDOptions,
    "easgd_async": AsyncEASGDOptions, "diloco": DiLoCoOptions, "slowmo": SlowMoOptions,
}

__all__ = [
    "OPTIONS", "ADPSGDOptions", "AlgorithmOptions", "AllReduceOptions", "AsyncEASGDOptions",
    "BoundedLagOptions", "DDPOptions", "DPSGDOptions", "DiLoCoOptions", "DownpourOptions",
    "EASGDOptions", "ElasticOptions", "GraphOptions", "LocalOptions", "LocalSGDOptions", "OSGPOptions",
    "PSOptions", "PeriodicOptions", "PushSumOptions", "Roles", "SGPOptions", "SlowMoOptions",
    "SyncPSOptions", "build_options", "check_workers", "coerce", "field_help", "parse",
]
