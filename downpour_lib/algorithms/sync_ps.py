"""Synchronous parameter-server SGD: the classic "downpour" set-up run in lock step.

A server rank (rank 0) holds the parameters and the optimizer. Each step every worker sends its
gradient to the server, the server averages them, steps, and sends the new parameters back. With
``server="dedicated"`` the server only serves; with ``"colocated"`` it also computes as a worker.
Floating-point buffers (batch-norm statistics) travel with the gradients and are averaged the same way.
The gradient push is a torch.distributed reduce and the parameter pull a broadcast, so the pattern
is the PS one while the transport is whatever the backend does best.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from ..comm.collectives import flatten, unflatten_into
from ..errors import ConfigError
from .base import Algorithm, AlgorithmOptions, Roles

SERVER = 0


@dataclass(frozen=True)
class SyncPSOptions(AlgorithmOptions):
    server: Literal["auto", "dedicated", "colocated"] = field(default="auto", metadata={
        "help": "dedicated: rank 0 only serves; colocated: rank 0 also computes; "
                "auto: dedicated when there are 2 or more ranks"})


class SyncPS(Algorithm):
    name = "sync_ps"
    Options = SyncPSOptions
    options: SyncPSOptions

    @classmethod
    def check_world(cls, options: SyncPSOptions, world_size: int) -> None:
        if options.server == "dedicated" and world_size < 2:
            raise ConfigError("server", "dedicated",
                              f"a dedicated server needs at least 2 ranks (1 server + 1 worker) "
                              f"but this launch has {world_size}; launch more ranks or use "
                              "server='colocated'")

    @classmethod
    def world_size_for(cls, options: SyncPSOptions, workers: int) -> int:
        return workers if options.server == "colocated" else workers + 1

    @classmethod
    def roles(cls, options: SyncPSOptions, world_size: int) -> Roles:
        dedicated = options.server == "dedicated" or (options.server == "auto" and world_size > 1)
        return Roles(workers=tuple(range(1 if dedicated else 0, world_size)), servers=(SERVER,),
                     evaluator=SERVER)

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        self.optimizer = optimizer
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.num_workers = len(self.roles(self.options, self.world_size).workers)
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        # Everyone starts from the server's parameters, whatever their own initialization was.
        self._pull(bucket="comm")
        return model

    def _push(self, grads: list[torch.Tensor], bucket: Literal["comm", "wait"]) -> None:
        """Send gradients (and buffers) to the server; on the server, leave their average."""
        flat = flatten(grads + self.buffers)
        self.comm.reduce(flat, dst=SERVER, bucket=bucket)
        if self.rank == SERVER:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            flat.div_(self.num_workers)
            unflatten_into(flat, [p.grad for p in self.params] + self.buffers)

    def _pull(self, bucket: Literal["comm", "wait"]) -> None:
        """Everyone receives the server's parameters and buffers."""
        flat = flatten([p.detach() for p in self.params] + self.buffers)
        self.comm.broadcast(flat, src=SERVER, bucket=bucket)
        if self.rank != SERVER:
            with torch.no_grad():
                unflatten_into(flat, self.params + self.buffers)

    def after_backward(self, model: nn.Module) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self._push(grads, bucket="comm")

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.rank == SERVER:
            optimizer.step()
        # A worker's time here is mostly the server's update: it counts as waiting.
        self._pull(bucket="comm" if self.rank == SERVER else "wait")

    def serve(self, steps: int, on_update: Callable[[int], None]) -> None:
        zeros = [torch.zeros_like(p) for p in self.params]
        for i in range(steps):
            # A dedicated server runs no forward pass: it adds nothing to the buffers' average.
            for b in self.buffers:
                b.zero_()
            self._push(zeros, bucket="wait")  # waiting for the workers' gradients
            self.optimizer.step()
            self._pull(bucket="comm")
            on_update(i)
