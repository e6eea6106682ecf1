"""Elastic averaging SGD (Zhang, Choromanska & LeCun, NIPS 2015, "Deep learning with Elastic
Averaging SGD"): the workers explore on their own and are pulled towards a center variable x~
every tau = ``period`` steps, and the center towards them, with moving rate alpha = eta * rho
(``moving_rate``; default 0.9 / N, the paper's beta = N alpha = 0.9).

Synchronous (``mode=sync``, the paper's Algorithm 1), every worker at once:

    x_i <- x_i - alpha (x_i - x~)            for every worker i
    x~  <- x~  + alpha sum_i (x_i - x~)      (the x_i before their own pull)

The center is kept on every worker (the sum is one allreduce), so it is the same everywhere; it
is what is evaluated and what the run ends with. Buffers (batch-norm statistics) are averaged at
each pull.

Asynchronous (``mode=async``, Algorithm 2, the center on a server rank as TorchMPI had): rank 0
holds the center and serves; every tau steps of its own, a worker sends it x_i and gets back the
center x~ as it was, and both move by the same elastic difference, the worker
x_i -= alpha (x_i - x~), the server x~ += alpha (x_i - x~). No worker waits for another. The first
worker evaluates the center (fetched from the server) and, after every worker's last exchange,
ends with the final center. Buffers stay each worker's own. It does not checkpoint yet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from ..comm.collectives import flatten, unflatten_into
from ..comm.p2p import HEADER, Link, header, message_group
from ..errors import ConfigError
from ..options import check_workers
from ..preempt import Unstoppable
from .base import Roles
from .localsgd import Periodic, PeriodicOptions
from .ps_server import DATA, DONE, FETCH, FINAL, PUSH, PUSH_DATA, REQUEST

SERVER = 0  # the asynchronous center's rank


@dataclass(frozen=True)
class EASGDOptions(PeriodicOptions):
    moving_rate: float | None = field(default=None, metadata={
        "help": "easgd: the moving rate alpha = eta * rho, in (0, 1/N]; none = 0.9 / N"})
    mode: Literal["sync", "async"] = field(default="sync", metadata={
        "help": "easgd: sync (every worker pulls at once, the center on every worker) or async "
                "(the center on a server rank, rank 0; each worker pulls on its own clock)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.moving_rate is not None and not (
                math.isfinite(self.moving_rate) and 0 < self.moving_rate <= 1):
            raise ConfigError("moving_rate", self.moving_rate, "must be in (0, 1], e.g. 0.1")

    def alpha(self, workers: int) -> float:
        return self.moving_rate or 0.9 / workers

    def checkpoint_refusal(self) -> str | None:
        if self.mode == "async":
            return "easgd with mode=async does not write checkpoints yet; use mode=sync"
        return None

    def roles(self, world_size: int) -> Roles:
        workers = world_size - (self.mode == "async")
        if workers < 1:
            raise ConfigError("mode", self.mode, "needs a server rank and at least one worker: "
                                                 "launch 2 ranks or more")
        if self.alpha(workers) * workers > 1:
            raise ConfigError("moving_rate", self.moving_rate,
                              f"alpha x workers = {self.alpha(workers) * workers:g} > 1 makes the "
                              f"center overshoot; use at most {1 / workers:g} with "
                              f"{workers} workers")
        if self.mode == "sync":
            return super().roles(world_size)
        return Roles(world_size, tuple(range(1, world_size)), (SERVER,), evaluator=1)

    def roles_for(self, workers: int) -> Roles:
        return self.roles(check_workers(workers) + (self.mode == "async"))


class EASGD(Periodic):
    name = "easgd"
    Options = EASGDOptions
    options: EASGDOptions

    def stopper(self, control, signal):
        if self.options.mode == "async":  # its server takes no steps to vote at
            return Unstoppable(signal, "easgd with mode=async cannot stop early or checkpoint")
        return super().stopper(control, signal)

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        model = super().setup(model, optimizer)  # every rank, the server too: one start
        self.alpha = self.options.alpha(len(self.roles.workers))
        self.center = flatten([p.detach() for p in self.params]).clone()
        self.asynchronous = self.options.mode == "async"
        self.final = False  # async, the evaluator: self.center is the run's final center
        if self.asynchronous:
            self.center = self.center.cpu()  # the messages' side
            self.link = Link(self.comm.ctx, self.comm.meter, message_group(self.comm.ctx))
        return model

    def after_step(self, model: nn.Module) -> None:
        self.t += 1
        self.met = self.t % self.options.period == 0
        if not self.asynchronous:
            if self.met:
                self._pull()
            return
        if self.met:
            self._exchange()
        if self.t == self.total:
            self._finish()

    @torch.no_grad()
    def _pull(self) -> None:
        x = flatten([p.detach() for p in self.params])
        diff = x - self.center
        total = diff.clone()
        if self.comm.active:
            self.comm.allreduce(total)
        unflatten_into(x - self.alpha * diff, self.params)
        self.center.add_(total, alpha=self.alpha)
        self.average_(self.buffers)

    # -- asynchronous: the worker's side --------------------------------------------------------

    def _ask(self, kind: int, x: torch.Tensor | None = None) -> torch.Tensor:
        """Send a request (with x_i for an exchange) to the server; the center it sends back."""
        center = torch.empty_like(self.center)
        works = [self.link.post_recv(center, SERVER, DATA),
                 self.link.post_send(header(kind), SERVER, REQUEST)]
        if x is not None:
            works.append(self.link.post_send(x, SERVER, PUSH_DATA))
        self.link.wait(works, account="comm")
        return center

    @torch.no_grad()
    def _exchange(self) -> None:
        x = flatten([p.detach() for p in self.params])
        center = self._ask(PUSH, x.cpu()).to(x.device)
        unflatten_into(x - self.alpha * (x - center), self.params)

    def _finish(self) -> None:
        """After the last step: DONE, or for the evaluator FINAL, which the server answers with
        the center once every worker is done."""
        if self.rank != self.roles.evaluator:
            self.link.send([header(DONE)], SERVER, REQUEST)
            return
        self.center, self.final = self._ask(FINAL), True

    # -- asynchronous: the server ---------------------------------------------------------------

    @torch.no_grad()
    def serve(self, steps: range, on_update: Callable[[int, int | None], None]) -> None:
        link, center = self.link, self.center
        request, x = torch.empty(HEADER, dtype=torch.int64), torch.empty_like(center)
        workers, done, finals, updates = set(self.roles.workers), set(), [], 0
        while not workers <= done:
            source = link.recv_any(request, REQUEST, account="wait")
            kind = int(request[0])
            if kind == PUSH:
                link.recv(x, source, PUSH_DATA)
                link.send([center.clone()], source, DATA)  # the center the worker pulls towards
                center.add_(x - center, alpha=self.alpha)
                on_update(updates, None)
                updates += 1
            elif kind == FETCH:
                link.send([center.clone()], source, DATA)
            elif kind in (DONE, FINAL):
                done.add(source)
                if kind == FINAL:
                    finals.append(source)
            else:
                raise RuntimeError(f"easgd server: unknown request kind {kind} from rank {source}")
        for source in finals:
            link.send([center.clone()], source, DATA)
        unflatten_into(center.to(self.params[0].device), self.params)  # the server ends as x~

    # -- evaluation and state -------------------------------------------------------------------

    def eval_metrics(self, model: nn.Module) -> dict[str, float]:
        return {} if self.asynchronous else super().eval_metrics(model)  # async: no collective

    @contextmanager
    def eval_parameters(self, model: nn.Module) -> Iterator[nn.Module]:
        """The center, in the model's place while it is evaluated (or checkpointed)."""
        if self.asynchronous and not self.final:
            self.center = self._ask(FETCH)
        own = flatten([p.detach() for p in self.params]).clone()
        with torch.no_grad():
            unflatten_into(self.center.to(own.device), self.params)
        try:
            yield model
        finally:
            with torch.no_grad():
                unflatten_into(own, self.params)

    def state_dict(self) -> dict[str, Any]:
        return {"center": self.center.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.center.copy_(state["center"])
