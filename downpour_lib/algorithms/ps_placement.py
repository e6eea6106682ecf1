"""Where parameter servers run: the options and placement shared by ``sync_ps`` and ``downpour``.

Servers are ranks 0..S-1. Dedicated servers only serve and the workers are the remaining ranks;
colocated servers also compute, so every rank is a worker. The evaluator is the first worker for
asynchronous training and server 0 for synchronous (where every rank holds every parameter).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..errors import ConfigError
from ..options import AlgorithmOptions, Roles, check_workers

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
        if isinstance(self.servers, bool) or not isinstance(self.servers, int) or self.servers < 1:
            raise ConfigError("servers", self.servers, "must be a whole number >= 1")

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
