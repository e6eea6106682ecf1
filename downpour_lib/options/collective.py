"""Options of the algorithms that average every step in collectives, and of ``local``: every rank
a worker (``local``: one process), the gradients allreduced in buckets (``allreduce``) or by
PyTorch's DistributedDataParallel (``ddp``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..errors import ConfigError
from .base import AlgorithmOptions, Roles, check_positive, check_whole


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


@dataclass(frozen=True)
class AllReduceOptions(AlgorithmOptions):
    #: per step, for the performance model (downpour_lib.perf): the gradients allreduced in buckets
    traffic: ClassVar[str] = "collective"
    overflow: ClassVar[Literal["reduced"]] = "reduced"  # fp16: averaged in backward, as DDP
    # DDP's 25 MB. On CPU ranks every bucket in flight takes CPU from backward, so fewer, larger
    # buckets win until there is only one (no overlap left). ResNet-18 (45 MB of gradients), 2 ranks,
    # one thread each, step time: mpi 82-86 ms at 25 MB, 86-88 at 16, 95-100 at 4 and 8, 108-112 at
    # 50 (one bucket); gloo 105-109 ms at 25 MB, 113-115 at 4, 127-130 at 50.
    bucket_cap_mb: float = field(default=25.0, metadata={
        "help": "gradient bucket size in MB; a bucket's allreduce starts as soon as backward has "
                "filled it"})
    compression: Literal["none", "fp16", "bf16"] = field(default="none", metadata={
        "help": "wire format of the gradients: none (their own dtype), fp16 or bf16 (half the "
                "bytes, rounded)"})
    accumulation_steps: int = field(default=1, metadata={
        "help": "micro-batches (engine steps) whose gradients are summed locally before one "
                "allreduce and one optimizer step"})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("bucket_cap_mb", self.bucket_cap_mb, "25", of="MB")
        check_whole("accumulation_steps", self.accumulation_steps, 1, "1 = no accumulation")


@dataclass(frozen=True)
class DDPOptions(AlgorithmOptions):
    #: per step, for the performance model (downpour_lib.perf): the gradients allreduced in buckets
    traffic: ClassVar[str] = "collective"
    overflow: ClassVar[Literal["reduced"]] = "reduced"  # fp16: DDP averages in backward
    bucket_cap_mb: float = field(default=25.0, metadata={"help": "DDP gradient bucket size in MB"})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("bucket_cap_mb", self.bucket_cap_mb, "25", of="MB")
