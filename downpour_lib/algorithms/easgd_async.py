"""Asynchronous elastic averaging SGD (Zhang, Choromanska & LeCun, NIPS 2015, Algorithm 2; the
center on a server rank as TorchMPI had): ``--algorithm easgd_async``.

Rank 0 holds the center x~ and serves it on the parameter-server protocol Downpour uses
(``ps_server.ServeLoop``, one shard: the model's floating-point parameters). Every tau =
``period`` steps of its own, a worker sends it x_i in an EXCHANGE and gets back the center as it
was before the exchange; both move by the same elastic difference, the worker
x_i -= alpha (x_i - x~), the server x~ += alpha (x_i - x~) (``ElasticPull``, the shard's
"optimizer": its push is x_i, not a gradient). No worker waits for another. The first worker
evaluates the center (a FETCH) and, after every worker's last exchange, ends with the final center
(its FINAL, answered once every worker is DONE). Buffers stay each worker's own. It neither
checkpoints nor stops early (``AsyncEASGDOptions.checkpoint_refusal``, ``stop_refusal``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..comm.collectives import flatten, unflatten_into
from ..comm.p2p import HEADER, header
from ..options import AsyncEASGDOptions
from ..options.periodic import SERVER
from .base import OnUpdate, Server
from .easgd import CenterState
from .localsgd import Periodic
from .ps_server import (
    DATA,
    DONE,
    EXCHANGE,
    FETCH,
    FINAL,
    PUSH_DATA,
    REPLY,
    REQUEST,
    ServeLoop,
    ShardServer,
    from_bytes,
)


class ElasticPull(torch.optim.Optimizer):
    """The center's side of an exchange: x~ += alpha (x_i - x~), with the worker's x_i in ``.grad``
    (where ``ShardServer.apply`` puts a push)."""

    def __init__(self, params: list[nn.Parameter], alpha: float) -> None:
        super().__init__(params, {"lr": alpha})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad - p, alpha=group["lr"])


class AsyncEASGD(CenterState, Periodic):
    name = "easgd_async"
    Options = AsyncEASGDOptions
    options: AsyncEASGDOptions

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module | Server:
        model = super().setup(model, optimizer)  # every rank, the server too: one start
        self.alpha = self.options.alpha(len(self.roles.workers))
        self.center = flatten([p.detach() for p in self.params]).clone().cpu()
        self.final = False  # the evaluator: self.center is the run's final center
        self.link = self.comm.messages()  # collective: every rank, before any message
        return CenterServer(self) if self.rank == SERVER else model

    def after_step(self, model: nn.Module) -> None:
        self.t += 1
        self.met = self.t % self.options.period == 0
        if self.met:
            self._exchange()
        if self.t == self.total:
            self._finish()

    # -- the worker's side ------------------------------------------------------------------------

    def _ask(self, kind: int, x: torch.Tensor | None = None) -> torch.Tensor:
        """A request (with x_i for an EXCHANGE) to the server; the center it sends back."""
        center, reply = torch.empty_like(self.center), torch.empty(HEADER, dtype=torch.int64)
        works = [self.link.irecv(reply, SERVER, REPLY), self.link.irecv(center, SERVER, DATA),
                 self.link.isend(header(kind, 0, self.t - 1), SERVER, REQUEST)]
        if x is not None:
            works.append(self.link.isend(x, SERVER, PUSH_DATA))
        self.link.wait(works, account="comm")
        return center

    @torch.no_grad()
    def _exchange(self) -> None:
        x = flatten([p.detach() for p in self.params])
        center = self._ask(EXCHANGE, x.cpu()).to(x.device)
        unflatten_into(x - self.alpha * (x - center), self.params)

    def _finish(self) -> None:
        """After the last step: DONE, or for the evaluator FINAL, which the server answers with
        its state (the center) once every worker is done."""
        if self.rank != self.roles.evaluator:
            self.link.send([header(DONE)], SERVER, REQUEST)
            return
        reply = torch.empty(HEADER, dtype=torch.int64)
        self.link.wait([self.link.irecv(reply, SERVER, REPLY),
                        self.link.isend(header(FINAL), SERVER, REQUEST)], account="comm")
        data = torch.empty(int(reply[0]), dtype=torch.uint8)
        self.link.recv(data, SERVER, DATA)
        self.center, self.final = flatten(from_bytes(data)["params"]), True

    # -- evaluation and state ---------------------------------------------------------------------

    def metrics(self, model: nn.Module | None = None) -> dict[str, float]:
        if model is None:
            return super().metrics()
        return {}  # the workers take no common steps: no collective at an evaluation

    @contextmanager
    def eval_parameters(self, model: nn.Module) -> Iterator[nn.Module]:
        """The center, in the model's place while it is evaluated."""
        if not self.final:
            self.center = self._ask(FETCH)
        with super().eval_parameters(model) as center:
            yield center


class CenterServer(Server):
    """Rank 0: the center x~ as a one-shard parameter server, whose pushes are elastic pulls."""

    def __init__(self, algorithm: AsyncEASGD) -> None:
        self.algorithm = algorithm
        alpha = algorithm.alpha
        self.shard = ShardServer(0, algorithm.params, [], lambda ps: ElasticPull(ps, alpha))

    @torch.no_grad()
    def serve(self, steps: range, on_update: OnUpdate) -> None:
        """The center's loop, until every worker is done; an update per exchange."""
        easgd, updates = self.algorithm, 0

        def applied(source: int, staleness: int) -> None:
            nonlocal updates
            on_update(updates, None, {})
            updates += 1

        ServeLoop(self.shard, easgd.link, easgd.roles.workers, on_update=applied).run()
        easgd.center = flatten([p.detach() for p in self.shard.params]).cpu()
        unflatten_into(easgd.center.to(easgd.params[0].device), easgd.params)  # the server ends as x~
