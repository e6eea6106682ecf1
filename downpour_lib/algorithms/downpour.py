"""Downpour SGD: asynchronous SGD with sharded parameter servers (Dean et al., NIPS 2012, "Large
Scale Distributed Deep Networks", section 4.1 and Algorithm 7.1).

S server ranks each own a shard of the parameters (``ps_shards``) and apply pushes in arrival order
(``ps_server``). Each worker (model replica) fetches fresh parameters from every server before each
step that is a multiple of ``n_fetch``, accumulates its gradients, and pushes the sum every
``n_push`` steps (and after its last step). Between fetches a worker moves its own copy with plain
SGD, as the paper's client does. Nothing is global: there is no barrier, and a slow worker only
delays its own pushes. With ``warmstart`` the other workers wait until the first one has pushed
that many times alone, which the paper found useful (section 5); it keeps the early, large Adagrad
steps from being repeated by several stale replicas at once.

Dedicated servers serve in the rank's main thread. A colocated server runs its loop in a thread
beside the rank's worker (``ps_server.ServerThread``), so that a computing or slow worker does not
stall the other workers' requests; the rank's own worker uses its shard directly, under a lock.

Every push is acknowledged with its staleness (the server's version when it applied the push minus
the version the gradient was computed from), which the worker records on its step; the server's
records carry it too. The evaluator (the first worker) fetches before evaluating and, after its
last step, asks every server for its final state, which each server sends once every worker is
done; that state is the run's final model and checkpoint.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..options import DownpourOptions
from ..preempt import Stopper, StopSignal
from ..records import Meter
from .base import Algorithm, OnUpdate, Points, Roles, Server
from .ps_client import ShardClient
from .ps_server import (
    FINAL,
    SNAPSHOT,
    ServeLoop,
    ServerThread,
    ShardServer,
)
from .ps_shards import model_layout, shard_tensors


class Downpour(Algorithm):
    name = "downpour"
    Options = DownpourOptions
    options: DownpourOptions

    @classmethod
    def check_plan(cls, options: DownpourOptions, roles: Roles, model: nn.Module,
                   total_steps: int, report: Callable[[str], None], precision: str = "fp32"
                   ) -> None:
        super().check_plan(options, roles, model, total_steps, report, precision)
        model_layout(model, len(roles.servers))
        if len(roles.workers) == 1:
            report("downpour with one worker: it pushes and fetches in turn, never stale, so this "
                   "run is sequential SGD with the server's optimizer, not asynchronous Downpour; "
                   "launch 2 or more workers to measure Downpour")

    # -- set-up --------------------------------------------------------------------------------

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module | Server:
        self.params, self.buffers = shard_tensors(model)
        self.servers, self.workers = self.roles.servers, self.roles.workers
        self.evaluator = self.roles.evaluator
        layout = model_layout(model, len(self.servers))
        # the worker's end of the messages, on the run's meter (collective: on every rank, before
        # any message); a colocated server thread gets the same group on a meter of its own
        self.link = self.comm.messages()
        shards = [([self.params[i] for i in layout.params(s)],
                   [self.buffers[i] for i in layout.buffers(s)]) for s in range(len(self.servers))]
        self.shard: ShardServer | None = None  # the shard this rank serves
        if self.rank in self.servers:
            index = self.servers.index(self.rank)
            kind, defaults = type(optimizer), dict(optimizer.defaults)
            self.shard = ShardServer(index, *shards[index], lambda ps: kind(ps, **defaults),
                                     self.lr_at, self.options.max_staleness)
        self.is_worker = self.rank in self.workers
        self.client = ShardClient(self.link, self.rank, self.servers, shards, self.shard,
                                  self.comm.ctx.device, (self.params or self.buffers)[0].dtype)
        self.thread: ServerThread | None = None  # a colocated server's loop
        self.local_done = threading.Event()  # this rank's worker has pushed for the last time
        self.refetch = False  # a push was refused as too stale: fetch before the next step
        self.pushed: dict[str, float] = {}  # the push of the step just taken, for records
        self.final: list[dict[str, Any]] | None = None  # the evaluator: every shard's last state
        self.finished = False
        self.signal: StopSignal | None = None  # set by the lifecycle's stopper (points)
        self.points = _ByMessages(self)
        return model if self.is_worker else DownpourServer(self)

    def start(self, steps: range) -> None:
        if not self.is_worker:
            return  # a dedicated server: its loop is serve()
        self.t, self.total = steps.start, steps.stop
        if self.shard is not None:  # colocated: this worker's shard is served by a thread
            remote = [w for w in self.workers if w != self.rank]
            self.thread = ServerThread(ServeLoop(
                self.shard, self.link.with_meter(Meter(self.comm.ctx.device)), remote,
                local_done=self.local_done, signal=self.signal))
            self.thread.start()
        if self.rank != self.workers[0]:  # Dean et al.'s warmstart: the first worker alone
            self.client.warmstart(min(self.options.warmstart, -(-steps.stop // self.options.n_push)))
        self.client.fetch(account="comm")

    # -- the worker's step (Algorithm 7.1) -----------------------------------------------------

    def after_backward(self, model: nn.Module) -> None:
        # fp16 (``overflow = "alone"``): a step that overflowed here reaches this hook with no
        # gradients, and this worker alone leaves it out of its next push
        self.client.accumulate(skip=self.loss_scaling and all(p.grad is None for p in self.params))
        if (self.t + 1) % self.options.n_push == 0 or self.t + 1 == self.total:
            self._push()

    def _push(self) -> None:
        self.pushed, self.refetch = self.client.push(self.t, self.options.max_staleness is not None)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        # The paper's client moves its own copy between fetches (parameters -= lr * gradient);
        # a step followed by a fetch would be overwritten, so it is skipped.
        if self.t + 1 < self.total and (self.t + 1) % self.options.n_fetch != 0 and not self.refetch:
            with torch.no_grad():
                for p in self.params:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-optimizer.param_groups[0]["lr"])

    def after_step(self, model: nn.Module) -> None:
        if self.thread is not None:
            self.thread.check()
        self.t += 1
        if self.t == self.total:
            self._finish()
        elif self.t % self.options.n_fetch == 0 or self.refetch:
            self.client.fetch(account="comm")
            self.refetch = False

    def metrics(self, model: nn.Module | None = None) -> dict[str, float]:
        """A worker's step: the staleness of the push it made (if any)."""
        if model is not None:
            return {}
        out, self.pushed = self.pushed, {}
        return out

    def _finish(self) -> None:
        """After the last push: the workers say DONE; the evaluator's FINAL request waits for the
        evaluation (``_final``), so that waiting for the other workers is not part of its step.
        A worker that stops early says so in it, and its servers tell the other workers."""
        self.local_done.set()
        if self.rank != self.evaluator:
            self.client.done(self.stopping)
        self.finished = True

    # -- preemption: agreed by the servers' replies, not by a vote ------------------------------

    stopping = False  # this worker stopped before its last step

    def stop_heard_locally(self) -> bool:
        """The signal here, or the run's stop heard from a server (by reply, or by the colocated
        server's loop)."""
        loop = self.thread.loop if self.thread is not None else None
        return (self.signal is not None and self.signal.requested()) or self.client.stop_heard \
            or (loop is not None and loop.stopping)

    def stop_early(self) -> None:
        """This worker's last step was the one just taken: push what it accumulated, tell the
        servers it is done and stopping."""
        if self.finished:
            return
        if self.client.acc_version is not None:
            self._push()
        self.stopping = True
        self._finish()

    def _final(self) -> list[dict[str, Any]]:
        """The evaluator, once its steps are done: every shard's final state (each server sends it
        when every worker is done). The evaluator's model ends as the run's final model."""
        if self.final is None:
            self.final = self.client.snapshots(FINAL, self.stopping, self._join_server)
            self.client.install_states(self.final)
        return self.final

    def _join_server(self) -> None:
        """The local shard is final once its loop has ended."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    # -- evaluation and checkpoints -------------------------------------------------------------

    @contextmanager
    def eval_parameters(self, model: nn.Module) -> Iterator[nn.Module]:
        """The servers' current parameters (the final ones after training); the worker's own copy
        is put back afterwards, so evaluating does not change its training."""
        if not self.is_worker:
            yield model
            return
        if self.finished and self.rank == self.evaluator:
            self._final()
            yield model
            return
        saved = [t.detach().clone() for t in [*self.params, *self.buffers]]
        versions = list(self.client.versions)
        self.client.fetch(account="wait")
        try:
            yield model
        finally:
            with torch.no_grad():
                for dst, src in zip([*self.params, *self.buffers], saved, strict=True):
                    dst.copy_(src)
            self.client.versions = versions

    def state_dict(self) -> dict[str, Any]:
        return self.shard.state_dict() if self.shard is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.shard is not None and state:
            self.shard.load_state_dict(state)

    def close(self) -> None:
        if self.is_worker and not self.finished and hasattr(self, "t"):
            self._finish()  # a loop that ended early still lets the servers stop
        if self.finished and self.rank == self.evaluator:
            self._final()
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def abort(self) -> None:
        # No message now: it could wait forever on a peer in the middle of another exchange. The
        # launcher's abort ends the others; a colocated server thread is a daemon and ends with
        # the process.
        self.thread = None


class DownpourServer(Server):
    """A rank that only serves: its shard's loop, in the rank's main thread."""

    def __init__(self, algorithm: Downpour) -> None:
        self.algorithm = algorithm

    def serve(self, steps: range, on_update: OnUpdate) -> None:
        """Serve every worker until each is done (``steps`` is not used: the number of updates
        depends on the workers, and none of them is a step). An update's record carries its
        staleness and the worker it came from."""
        downpour, updates = self.algorithm, 0

        def applied(source: int, staleness: int) -> None:
            nonlocal updates
            on_update(updates, None, {"staleness": float(staleness), "source_rank": float(source)})
            updates += 1

        ServeLoop(downpour.shard, downpour.link, downpour.workers, on_update=applied,
                  signal=downpour.signal).run()


class _ByMessages(Points):
    """Downpour's ranks take no common steps: they agree to stop by the servers' replies
    (``_StopByMessages``), and the evaluator alone writes a checkpoint, with the servers' shards
    it asks them for by message (they are serving, not stepping)."""

    def __init__(self, algorithm: Downpour) -> None:
        self.algorithm = algorithm

    def stopper(self, signal: StopSignal) -> Stopper:
        self.algorithm.signal = signal  # the servers' loops pass it on to the workers
        return _StopByMessages(self.algorithm)

    def collect_states(self, local: Callable[[], dict[str, Any]], final: bool
                       ) -> dict[int, dict[str, Any]] | None:
        """On the evaluator alone; the other workers write nothing."""
        downpour = self.algorithm
        if downpour.rank != downpour.evaluator:
            return None
        states = downpour._final() if final else downpour.client.snapshots(SNAPSHOT,
                                                                           downpour.stopping)
        ranks = {server: {"algorithm": state}
                 for server, state in zip(downpour.servers, states, strict=True)}
        ranks[downpour.rank] = {**local(), **ranks.get(downpour.rank, {})}  # a colocated shard
        return ranks


class _StopByMessages(Stopper):
    """Downpour's agreement to stop: a worker that has the signal, or has heard from a server that
    the run is stopping, stops after its step; its DONE tells the servers, whose replies tell the
    other workers (at their next fetch). Nobody waits for anybody; the evaluator's checkpoint holds
    the servers' final shards, sent once every worker has stopped."""

    def __init__(self, algorithm: Downpour) -> None:
        self.algorithm = algorithm

    def at_point(self, step: int) -> bool:
        if not self.algorithm.stop_heard_locally():
            return False
        self.algorithm.stop_early()
        return True
