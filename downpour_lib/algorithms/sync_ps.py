"""Synchronous parameter-server SGD: the parameter-server set-up of Dean et al. (NIPS 2012, "Large
Scale Distributed Deep Networks") run in lock step.

S server ranks (0..S-1) each own a shard of the parameters, balanced by bytes (``ps_shards``), and
hold the optimizer state for it. Each step every worker sends each shard of its gradient to the
shard's server, each server averages what it got, steps its shard, and sends the shard's new
parameters back. With ``server="dedicated"`` the servers only serve; with ``"colocated"`` they also
compute as workers. Floating-point buffers (batch-norm statistics) travel with the gradients and are
averaged the same way. A push is a torch.distributed reduce to the shard's server and a pull a
broadcast from it, so the pattern is the PS one while the transport is whatever the backend does
best. Every update is element-wise, so S servers give the same parameters as one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from ..comm.collectives import flatten, unflatten_into
from ..options import SyncPSOptions
from ..schedule import set_lr
from .base import Algorithm, OnUpdate, Roles, Server, vote_overflow
from .ps_shards import model_layout, shard_tensors


class SyncPS(Algorithm):
    name = "sync_ps"
    Options = SyncPSOptions
    options: SyncPSOptions

    @classmethod
    def check_plan(cls, options: SyncPSOptions, roles: Roles, model: nn.Module,
                   total_steps: int, report: Callable[[str], None], precision: str = "fp32"
                   ) -> None:
        super().check_plan(options, roles, model, total_steps, report, precision)
        model_layout(model, len(roles.servers))

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module | Server:
        self.optimizer = optimizer
        self.params, self.buffers = shard_tensors(model)
        self.servers, self.num_workers = self.roles.servers, len(self.roles.workers)
        self.layout = model_layout(model, len(self.servers))
        # the shard this rank serves (None on a plain worker)
        self.shard = self.servers.index(self.rank) if self.rank in self.servers else None
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        # Everyone starts from the servers' parameters, whatever their own initialization was.
        self._pull(account="comm")
        return model if self.rank in self.roles.workers else SyncPSServer(self)

    def _members(self, shard: int) -> tuple[list[int], list[int]]:
        return self.layout.params(shard), self.layout.buffers(shard)

    def _push(self, grads: list[torch.Tensor], account: Literal["comm", "wait"]) -> None:
        """Send each shard of the gradients (and buffers) to its server; a server is left with
        its shard's average in ``.grad`` and every other parameter's ``.grad`` set to None, so
        that its optimizer steps its own shard only."""
        for shard, server in enumerate(self.servers):
            pi, bi = self._members(shard)
            flat = flatten([grads[i] for i in pi] + [self.buffers[i] for i in bi])
            self.comm.reduce(flat, root=server, account=account, scratch=True)
            if shard == self.shard:
                flat.div_(self.num_workers)
                for p in self.params:
                    p.grad = None
                mine = [self.params[i] for i in pi]
                for p in mine:
                    p.grad = torch.zeros_like(p)
                unflatten_into(flat, [p.grad for p in mine] + [self.buffers[i] for i in bi])

    def _pull(self, account: Literal["comm", "wait"]) -> None:
        """Everyone receives every shard's parameters and buffers from its server."""
        for shard, server in enumerate(self.servers):
            pi, bi = self._members(shard)
            tensors = [self.params[i] for i in pi] + [self.buffers[i] for i in bi]
            flat = flatten([t.detach() for t in tensors])
            self.comm.broadcast(flat, root=server, account=account)
            if self.rank != server:
                with torch.no_grad():
                    unflatten_into(flat, tensors)

    def after_backward(self, model: nn.Module) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self._push(grads, account="comm")

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.shard is not None:
            optimizer.step()
        # A worker's time here is mostly the servers' update: it counts as waiting.
        self._pull(account="comm" if self.shard is not None else "wait")


class SyncPSServer(Server):
    """A server that only serves: each workers' step, its shard's half of the push and pull the
    workers make in ``after_backward`` and ``step``, and its shard's update between them."""

    def __init__(self, algorithm: SyncPS) -> None:
        self.algorithm = algorithm

    def serve(self, steps: range, on_update: OnUpdate) -> None:
        ps = self.algorithm
        zeros = [torch.zeros_like(p) for p in ps.params]
        for i, step in enumerate(steps):
            # the workers agree on fp16 overflows before they push (AlgorithmOptions.overflow)
            skip = vote_overflow(ps.comm, False) if ps.loss_scaling else False
            # A dedicated server runs no forward pass: it adds nothing to the buffers' average.
            for b in ps.buffers:
                b.zero_()
            ps._push(zeros, account="wait")  # waiting for the workers' gradients
            if ps.lr_at is not None:
                set_lr(ps.optimizer, ps.lr_at(step))
            if not skip:
                ps.optimizer.step()
            ps._pull(account="comm")
            on_update(i, step, {})  # the workers' step: servers and workers step together
