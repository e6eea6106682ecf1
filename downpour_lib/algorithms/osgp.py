"""Overlap-SGP: Stochastic Gradient Push with its messages left in flight during the next step.

Assran, Loizou, Ballas and Rabbat, "Stochastic Gradient Push for Distributed Deep Learning",
ICML 2019, Section 3 ("Overlap SGP"): the push-sum shares a rank sends at step t need not be
absorbed by their receivers at step t; they travel while the next forward and backward passes run,
and are absorbed up to ``max_lag`` steps later. Push-sum stays exact under such delays (the mass in
flight is only late, never lost), and the weight w_i de-biases whatever has arrived.

Exact semantics of step t (messages are posted at the end of a step and absorbed at the start of
the update of a later one, so they travel during at least one forward and backward pass):

1. ``after_backward``: the parameters become the numerator x_i = w_i z_i, and the in-flight
   messages are absorbed in the order they were sent: every message sent at step s <= t - max_lag
   is waited for (the bound: no message lags more than ``max_lag`` steps), and earlier-sent
   messages that have already arrived are absorbed too;
2. ``step``: the optimizer applies the gradient (taken at z_i before the absorption) to x_i;
3. ``after_step``: step t's shares are posted (receives from the in-peers, sends to the
   out-peers, non-blocking) and the parameters are de-biased to z_i = x_i / w_i, which the next
   forward pass and any evaluation see.

With ``max_lag=1`` a message sent at step t is absorbed at step t + 1 exactly, so runs are
reproducible; larger bounds absorb early when the network is fast. ``close`` (and ``state_dict``)
absorb everything still in flight, so at the end the ranks' numerators again sum to the initial
mass. The ``staleness`` column is the mean lag, in steps, of the messages absorbed in that step.
A synchronous variant (lag 0) is not an option: that is ``sgp``.

What is evaluated (``eval_parameters``, and the consensus distance) is the de-biased model with the
messages already sent to this rank included (``landed``), as the SGP authors' code completes the
gossip in flight before it evaluates; otherwise rank 0 would be judged on the half of its model
that has not mixed yet. ``landed`` waits for those messages but absorbs nothing, so with
``max_lag=1`` evaluation does not change training; with a larger bound a message waited for at an
evaluation point counts as arrived and is absorbed at the next step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch._utils import _unflatten_dense_tensors

from ..comm.collectives import flatten
from ..comm.p2p import Exchange
from ..options import OSGPOptions
from .sgp import PushSumAlgorithm


class OSGP(PushSumAlgorithm):
    name = "osgp"
    Options = OSGPOptions
    options: OSGPOptions

    def setup(self, model: nn.Module, optimizer) -> nn.Module:
        module = super().setup(model, optimizer)
        self.in_flight: deque[tuple[int, Exchange]] = deque()  # (step sent, its messages)
        self.staleness = float("nan")
        return module

    def after_backward(self, model: nn.Module) -> None:
        super().after_backward(model)  # the parameters now hold the numerator x
        t = self.step_index
        lags = []
        while self.in_flight:
            sent, posted = self.in_flight[0]
            if t - sent < self.options.max_lag and not posted.is_completed():
                break
            self.in_flight.popleft()
            self.push_sum.absorb(self.comm.complete(posted, account="wait"))
            lags.append(t - sent)
        self.staleness = sum(lags) / len(lags) if lags else float("nan")

    def after_step(self, model: nn.Module) -> None:
        self.in_flight.append((self.step_index, self.push_sum.post(self.step_index)))
        self.push_sum.debias()
        self.step_index += 1

    @torch.no_grad()
    def landed(self) -> tuple[list[torch.Tensor], float]:
        """(de-biased parameters, weight) as they will be once every message in flight to this rank
        has landed. Waits for those messages but absorbs nothing: training's schedule is kept."""
        weight = self.push_sum.weight
        numerators = [p.detach() * weight for p in self.params]
        for _, posted in self.in_flight:
            for buf in posted.wait():
                for x, share in zip(numerators, _unflatten_dense_tensors(buf[:-1], self.params),
                                    strict=True):
                    x.add_(share)
                weight += float(buf[-1])
        return [x.div_(weight) for x in numerators], weight

    def local_vector(self, model: nn.Module) -> torch.Tensor:
        return flatten(self.landed()[0])

    @contextmanager
    def eval_parameters(self, model: nn.Module) -> Iterator[nn.Module]:
        # As the SGP authors' code does before evaluating, include the gossip in flight to us.
        saved = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, z in zip(self.params, self.landed()[0], strict=True):
                p.copy_(z)
        try:
            yield model
        finally:
            with torch.no_grad():
                for p, z in zip(self.params, saved, strict=True):
                    p.copy_(z)

    def metrics(self, model: nn.Module | None = None) -> dict[str, float]:
        if model is None:
            return {"staleness": self.staleness}
        return super().metrics(model)

    def drain(self) -> None:
        """Absorb every message still in flight (each has a receiver: all ranks post the same
        steps), leaving the de-biased parameters."""
        if not self.in_flight:
            return
        self.push_sum.to_numerators()
        while self.in_flight:
            _, posted = self.in_flight.popleft()
            self.push_sum.absorb(self.comm.complete(posted, account="wait"))
        self.push_sum.debias()

    def state_dict(self) -> dict[str, Any]:
        self.drain()  # in-flight mass cannot be saved; fold it in so none is lost
        return super().state_dict()

    def close(self) -> None:
        self.drain()  # every message in flight has a receiver: none of the mass is lost
