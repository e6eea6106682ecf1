"""Options of the parameter-server algorithms, and where their servers run (``PSOptions``, shared by
``sync_ps`` and ``downpour``).

Servers are ranks 0..S-1. Dedicated servers only serve and the workers are the remaining ranks;
colocated servers also compute, so every rank is a worker. The evaluator is the first worker for
asynchronous training and server 0 for synchronous (where every rank holds every parameter).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..errors import ConfigError
from .base import AlgorithmOptions, Roles, check_whole, check_workers

ServerSite = Literal["auto", "dedicated", "colocated"]


@dataclass(frozen=True)
class PSOptions(AlgorithmOptions):
    #: Which rank evaluates and writes checkpoints: server 0, or the first worker.
    evaluator: ClassVar[Literal["server", "worker"]] = "server"

    server: ServerSite = field(default="auto", metadata={
        "help": "dedicated: the server ranks only serve; colocated: they also compute; "
                "auto: dedicated when there are more ranks than servers"})
    servers: int = field(default=1, metadata={
        "help": "parameter servers (ranks 0..S-1), each owning a shard of the parameters "
                "balanced by bytes"})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_whole("servers", self.servers, 1)

    def dedicated(self, world_size: int) -> bool:
        return self.server == "dedicated" or (self.server == "auto" and world_size > self.servers)

    def roles(self, world_size: int) -> Roles:
        """More servers than the launch can hold fail here, before any rank waits for another."""
        s = self.servers
        if self.server == "dedicated" and world_size < s + 1:
            who = "a dedicated server needs" if s == 1 else f"{s} dedicated servers need"
            raise ConfigError("servers" if s > 1 else "server", s if s > 1 else "dedicated",
                              f"{who} at least {s + 1} ranks ({s} server(s) + 1 worker) but this "
                              f"launch has {world_size}; launch more ranks, use fewer servers, or "
                              "server='colocated'")
        if s > world_size:
            raise ConfigError("servers", s,
                              f"{s} servers need at least {s} ranks but this launch has "
                              f"{world_size}; use servers <= {world_size} or launch more ranks")
        servers = tuple(range(s))
        workers = tuple(range(s if self.dedicated(world_size) else 0, world_size))
        return Roles(world_size, workers, servers,
                         evaluator=servers[0] if self.evaluator == "server" else workers[0])

    def roles_for(self, workers: int) -> Roles:
        check_workers(workers)
        if self.server == "colocated":
            if workers < self.servers:
                raise ConfigError("servers", self.servers,
                                  f"colocated servers are workers too, so {self.servers} servers "
                                  f"need at least {self.servers} workers, not {workers}")
            return self.roles(workers)
        return self.roles(workers + self.servers)


@dataclass(frozen=True)
class SyncPSOptions(PSOptions):
    #: per step, for the performance model: push to and pull from S server shards, in lock-step
    traffic: ClassVar[str] = "push_pull"
    """Where the servers run and how many there are (``PSOptions``)."""

    # after the pull every rank holds every parameter, so server 0 can evaluate
    evaluator: ClassVar[Literal["server", "worker"]] = "server"


@dataclass(frozen=True)
class DownpourOptions(PSOptions):
    #: for the performance model: push every n_push, fetch every n_fetch steps, each on its own clock
    traffic: ClassVar[str] = "async_push_pull"
    default_optimizer: ClassVar[str] = "adagrad"  # as in Dean et al. 2012
    # fp16: no worker steps with another; one that overflowed leaves the step out of its push
    overflow: ClassVar[Literal["alone"]] = "alone"
    # a worker evaluates: it can fetch every shard; the servers each hold one
    evaluator: ClassVar[Literal["server", "worker"]] = "worker"
    n_fetch: int = field(default=1, metadata={
        "help": "a worker fetches the parameters before every n_fetch-th step"})
    n_push: int = field(default=1, metadata={
        "help": "a worker pushes its accumulated gradients every n_push steps"})
    warmstart: int = field(default=20, metadata={
        "help": "the other workers start once the first one has made this many pushes alone "
                "(Dean et al.'s warmstart; at most all of its pushes); 0: all start together"})
    max_staleness: int | None = field(default=None, metadata={
        "help": "downpour: a push computed from parameters more than this many server updates "
                "old is refused, and its worker fetches fresh ones before its next step "
                "(bounded staleness; 0 = every applied push is fresh); none = no bound"})

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("n_fetch", "n_push"):
            check_whole(name, getattr(self, name), 1, "1 = every step, as in synchronous SGD",
                        of="steps")
        check_whole("warmstart", self.warmstart, 0, of="pushes")
        if self.max_staleness is not None:
            check_whole("max_staleness", self.max_staleness, 0, "or none for no bound",
                        of="updates")
