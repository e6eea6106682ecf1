"""Post-local SGD (Lin, Stich, Patel & Jaggi, ICLR 2020, "Don't Use Large Mini-Batches, Use Local
SGD"): synchronous gradient averaging for the first ``sync_steps`` steps, then every worker steps on
its own and the parameters are averaged exactly every ``period`` steps.

The same semantics as PyTorch's ``PeriodicModelAverager(period, warmup_steps)`` after every
optimizer step, with the post-local-SGD communication hook averaging gradients before it (a test
compares the two): at step t (from 0) the parameters are averaged when ``t >= sync_steps`` and
``(t - sync_steps) % period == 0``. A worker's optimizer state (momentum) stays its own. Buffers
(batch-norm statistics) are averaged with the parameters. Between averagings nothing is sent, so
the bytes of a run are about 1/period of allreduce SGD's.

``Periodic`` is the base of the methods that train locally and meet every few steps (local SGD,
DiLoCo, SlowMo, EASGD): the model's floating-point state as one vector, exact averages of it, the
step count, and the consensus distance at evaluation points.
"""

from __future__ import annotations

import torch
from torch import nn

from ..comm.collectives import flatten, unflatten_into
from ..comm.gossip import consensus_distance
from ..comm.model_sync import synchronize_parameters
from ..options import LocalSGDOptions
from .base import Algorithm


class Periodic(Algorithm):
    """Local steps, and every few of them a meeting of all workers. Every rank is a worker."""

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        synchronize_parameters(model, root=0, group=self.comm)  # one starting point
        self.model, self.optimizer = model, optimizer
        self.params = [p for p in model.parameters() if p.is_floating_point()]
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.t = 0  # steps taken (the engine's step index of the next step)
        self.total = 0
        self.met = False  # whether the step just taken ended in a meeting (records)
        return model

    def start(self, steps: range) -> None:
        self.t, self.total = steps.start, steps.stop

    def state(self) -> list[torch.Tensor]:
        """What meets: the parameters, then the floating-point buffers."""
        return [*self.params, *self.buffers]

    def average_(self, tensors: list[torch.Tensor], dtype: torch.dtype | None = None) -> None:
        """Replace ``tensors`` by their exact average over the ranks (sent as ``dtype``)."""
        if not self.comm.active or not tensors:
            return
        flat = flatten([t.detach() for t in tensors])
        wire = flat if dtype is None else flat.to(dtype)
        self.comm.allreduce(wire)
        wire.div_(self.comm.size)
        with torch.no_grad():
            unflatten_into(wire.to(flat.dtype) if dtype is not None else wire, tensors)

    def metrics(self, model: nn.Module | None = None) -> dict[str, float]:
        if model is None:
            return {"outer_step": float(self.met)}
        # collective: every rank reaches the same evaluation points
        return {"consensus_distance": consensus_distance(self.comm, flatten(
            [p.detach() for p in self.params]))}


class LocalSGD(Periodic):
    name = "localsgd"
    Options = LocalSGDOptions
    options: LocalSGDOptions

    def after_backward(self, model: nn.Module) -> None:
        if self.t < self.options.sync_steps:  # the warm-up: synchronous SGD
            self.average_([p.grad for p in self.params if p.grad is not None])

    def after_step(self, model: nn.Module) -> None:
        sync, period = self.options.sync_steps, self.options.period
        self.met = self.t >= sync and (self.t - sync) % period == 0
        if self.met:
            self.average_(self.state())
        self.t += 1
