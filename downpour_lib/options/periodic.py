"""Options of the algorithms that train locally and meet every few steps: ``localsgd``,
``diloco``, ``slowmo``, ``easgd`` and ``easgd_async`` (the center on a server rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..errors import ConfigError
from .base import AlgorithmOptions, Roles, check_momentum, check_positive, check_whole, check_workers

PERIOD_HELP = ("steps between the workers' meetings: localsgd's and slowmo's averaging, diloco's "
               "outer step (its H), easgd's elastic pull (its tau)")


SERVER = 0  # the asynchronous center's rank


@dataclass(frozen=True)
class PeriodicOptions(AlgorithmOptions):
    #: for the performance model: the model allreduced once every ``period`` steps
    traffic: ClassVar[str] = "periodic"
    period: int = field(default=4, metadata={"help": PERIOD_HELP})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_whole("period", self.period, 1, "1 = meet after every step")


@dataclass(frozen=True)
class LocalSGDOptions(PeriodicOptions):
    sync_steps: int = field(default=0, metadata={
        "help": "localsgd: first steps with synchronous gradient averaging (post-local SGD's "
                "warm-up) before local steps begin"})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_whole("sync_steps", self.sync_steps, 0, "0 = local steps from the start")


@dataclass(frozen=True)
class DiLoCoOptions(PeriodicOptions):
    default_optimizer: ClassVar[str] = "adamw"  # the paper's inner optimizer
    default_lr: ClassVar[float | None] = 0.003
    period: int = field(default=20, metadata={"help": PERIOD_HELP})
    outer_lr: float = field(default=0.7, metadata={
        "help": "diloco: the outer SGD's learning rate (the paper's 0.7)"})
    outer_momentum: float = field(default=0.9, metadata={
        "help": "diloco: the outer SGD's Nesterov momentum (the paper's 0.9; 0 = none)"})
    pseudo_gradient: Literal["none", "bf16", "fp16"] = field(default="none", metadata={
        "help": "diloco: the pseudo-gradient's wire format (none = fp32)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("outer_lr", self.outer_lr, "0.7")
        check_momentum("outer_momentum", self.outer_momentum, "0.9")


@dataclass(frozen=True)
class SlowMoOptions(LocalSGDOptions):
    base: Literal["localsgd", "sgp"] = field(default="localsgd", metadata={
        "help": "slowmo: the base method between meetings (localsgd: local steps; sgp: gossip on "
                "SGP's exponential graph)"})
    slow_momentum: float = field(default=0.5, metadata={
        "help": "slowmo: the slow momentum beta (0 = none)"})
    slow_lr: float = field(default=1.0, metadata={"help": "slowmo: the slow learning rate alpha"})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_momentum("slow_momentum", self.slow_momentum, "0.5")
        check_positive("slow_lr", self.slow_lr, "1")


@dataclass(frozen=True)
class ElasticOptions(PeriodicOptions):
    """What synchronous and asynchronous EASGD share: the moving rate alpha, and that alpha x
    workers may not pass 1 (the center would overshoot)."""

    moving_rate: float | None = field(default=None, metadata={
        "help": "easgd, easgd_async: the moving rate alpha = eta * rho, in (0, 1/N]; "
                "none = 0.9 / N"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.moving_rate is not None and not (
                math.isfinite(self.moving_rate) and 0 < self.moving_rate <= 1):
            raise ConfigError("moving_rate", self.moving_rate, "must be in (0, 1], e.g. 0.1")

    def alpha(self, workers: int) -> float:
        return self.moving_rate or 0.9 / workers

    def in_effect(self, roles: Roles) -> dict[str, Any]:
        return {"moving_rate": self.alpha(len(roles.workers))}

    def check_alpha(self, workers: int) -> None:
        if self.alpha(workers) * workers > 1:
            raise ConfigError("moving_rate", self.moving_rate,
                              f"alpha x workers = {self.alpha(workers) * workers:g} > 1 makes the "
                              f"center overshoot; use at most {1 / workers:g} with "
                              f"{workers} workers")


@dataclass(frozen=True)
class EASGDOptions(ElasticOptions):
    #: options easgd no longer takes, and what to give instead (``build_options`` says so)
    retired: ClassVar[dict[str, str]] = {"mode": (
        "easgd is synchronous EASGD; asynchronous EASGD is its own algorithm, easgd_async: drop "
        "mode, or give algorithm=easgd_async (--algorithm easgd_async)")}

    def roles(self, world_size: int) -> Roles:
        self.check_alpha(world_size)
        return super().roles(world_size)


@dataclass(frozen=True)
class AsyncEASGDOptions(ElasticOptions):
    """Asynchronous EASGD: the center on a server rank (``SERVER``), every other rank a worker."""

    #: for the performance model: each worker pulls from the center on its own clock (simulated)
    traffic: ClassVar[str] = "async_push_pull"

    def checkpoint_refusal(self) -> str | None:
        return "easgd_async does not write checkpoints yet; use easgd"

    def stop_refusal(self) -> str | None:
        return "easgd_async cannot stop early or checkpoint"  # its server takes no steps to vote at

    def roles(self, world_size: int) -> Roles:
        workers = world_size - 1
        if workers < 1:
            raise ConfigError("world_size", world_size, "easgd_async needs a server rank and at "
                                                        "least one worker: launch 2 ranks or more")
        self.check_alpha(workers)
        return Roles(world_size, tuple(range(1, world_size)), (SERVER,), evaluator=1)

    def roles_for(self, workers: int) -> Roles:
        return self.roles(check_workers(workers) + 1)
