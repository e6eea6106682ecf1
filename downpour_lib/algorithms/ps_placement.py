"""Where parameter servers run: the options and roles shared by ``sync_ps`` and ``downpour``.

Servers are ranks 0..S-1. Dedicated servers only serve and the workers are the remaining ranks;
colocated servers also compute, so every rank is a worker. The evaluator is the first worker for
asynchronous training and server 0 for synchronous (where every rank holds every parameter).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..errors import ConfigError
from .base import AlgorithmOptions, Roles

Placement = Literal["auto", "dedicated", "colocated"]


@dataclass(frozen=True)
class PSOptions(AlgorithmOptions):
    server: Placement = field(default="auto", metadata={
        "help": "dedicated: the server ranks only serve; colocated: they also compute; "
                "auto: dedicated when there are more ranks than servers"})
    servers: int = field(default=1, metadata={
        "help": "parameter servers (ranks 0..S-1), each owning a shard of the parameters "
                "balanced by bytes"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.servers, bool) or not isinstance(self.servers, int) or self.servers < 1:
            raise ConfigError("servers", self.servers, "must be a whole number >= 1")


def dedicated(options: PSOptions, world_size: int) -> bool:
    return options.server == "dedicated" or (options.server == "auto" and world_size > options.servers)


def check_world(options: PSOptions, world_size: int) -> None:
    """More servers than the launch can hold fail here, before any rank waits for another."""
    s = options.servers
    if options.server == "dedicated" and world_size < s + 1:
        who = "a dedicated server needs" if s == 1 else f"{s} dedicated servers need"
        raise ConfigError("servers" if s > 1 else "server", s if s > 1 else "dedicated",
                          f"{who} at least {s + 1} ranks ({s} server(s) + 1 worker) but this "
                          f"launch has {world_size}; launch more ranks, use fewer servers, or "
                          "server='colocated'")
    if s > world_size:
        raise ConfigError("servers", s,
                          f"{s} servers need at least {s} ranks but this launch has {world_size}; "
                          f"use servers <= {world_size} or launch more ranks")


def world_size_for(options: PSOptions, workers: int) -> int:
    if options.server == "colocated":
        if workers < options.servers:
            raise ConfigError("servers", options.servers,
                              f"colocated servers are workers too, so {options.servers} servers "
                              f"need at least {options.servers} workers, not {workers}")
        return workers
    return workers + options.servers


def roles(options: PSOptions, world_size: int, evaluator: Literal["server", "worker"]) -> Roles:
    servers = tuple(range(min(options.servers, world_size)))
    workers = tuple(range(len(servers) if dedicated(options, world_size) else 0, world_size))
    return Roles(workers=workers, servers=servers,
                 evaluator=servers[0] if evaluator == "server" else workers[0])
