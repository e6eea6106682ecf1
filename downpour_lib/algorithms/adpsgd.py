"""AD-PSGD: asynchronous decentralized parallel SGD, pairwise averaging on a bipartite graph.

Lian, Zhang, Zhang and Liu, "Asynchronous Decentralized Parallel Stochastic Gradient Descent",
ICML 2018, Algorithm 1: each rank keeps computing gradients at whatever its model is when it reads
it, while a communication thread keeps averaging that model with one peer at a time,
x_i, x_j <- (x_i + x_j) / 2. No rank ever waits for all the others: there is no global barrier, only
the pair being averaged talks. Edges join odd (active) with even (passive) ranks (the bipartite
graph of ``topology.py``), so two averages can never chain into a cycle and deadlock.

How this implementation runs it (one ``PairwiseAveraging`` thread per rank, on a process group of
its own, since gloo must not drive one group from two threads at once):

- the live model is a flat vector the thread owns; training reads it into the parameters, applies
  the optimizer's update at ``step`` and writes it back, all under the thread's lock. Averaging
  therefore never edits a tensor autograd is using, and the update lands on the model as it is
  *now*, averages included: the gradient is stale by the averages done meanwhile (``staleness``);
- averaging round r (the r-th of the rank) starts once training finished step r, and exchanges
  with the partner the bipartite graph gives at r (a perfect matching every round). Because every
  rank runs as many steps, every round has a partner and the thread ends cleanly: no DONE message;
- ``max_lag`` bounds how far the thread may fall behind: the update of step t waits until round
  t - max_lag is done. Training otherwise never waits for a peer;
- the average is applied as x_i += (x_j' - x_i') / 2 with x_i', x_j' the exchanged snapshots, so
  an update made by training during the exchange is kept whole and the pair's sum is conserved.

The SGP authors' code cycled the partners deterministically too (their bipartite exponential
graph); the paper's uniformly random partner is not needed for the averaging to contract.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..comm.collectives import flatten, nbytes, unflatten_into
from ..comm.gossip import destroy_group, new_group
from ..comm.p2p import exchange
from ..options import ADPSGDOptions
from ..topology import Topology
from .base import Roles
from .decentralized import Decentralized


class PairwiseAveraging:
    """The communication thread of one rank. ``start()`` and ``close()`` are explicit; an error in
    the thread is re-raised in the training thread at its next call."""

    def __init__(self, vector: torch.Tensor, topology: Topology, rank: int, group) -> None:
        self.vector, self.topology, self.rank, self.group = vector, topology, rank, group
        self._cond = threading.Condition()  # guards vector and the counters below
        self.requested = 0  # rounds training has released
        self.done = 0  # rounds finished and folded into vector
        self._closing = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the averaging thread is already started")
        # daemon: a rank that dies of another error must not hang at exit on this thread
        self._thread = threading.Thread(target=self._run, name=f"adpsgd-averaging-{self.rank}",
                                        daemon=True)
        self._thread.start()

    @contextmanager
    def locked(self) -> Iterator[torch.Tensor]:
        """The live model vector, with the thread kept off it."""
        with self._cond:
            self._raise_if_failed()
            yield self.vector

    def release_round(self) -> None:
        """Training finished a step: the next averaging round may start."""
        with self._cond:
            self._raise_if_failed()
            self.requested += 1
            self._cond.notify_all()

    def wait_for(self, rounds: int) -> None:
        """Block until at least ``rounds`` rounds are done."""
        if self._thread is None and self.done < rounds and not self._closing:
            raise RuntimeError("AD-PSGD's averaging thread was never started: a training loop of "
                               "your own calls algorithm.start(steps) after setup")
        with self._cond:
            while self.done < rounds and self._error is None:
                self._cond.wait()
            self._raise_if_failed()

    def close(self) -> None:
        """Finish every released round (each has a partner), stop the thread, re-raise its error."""
        if self._thread is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        self._thread = None
        self._raise_if_failed()

    def abandon(self) -> None:
        """Stop without waiting: the thread ends after its current exchange (or with the
        process, being a daemon, if that exchange never completes because a peer died)."""
        with self._cond:
            self._closing = True
            self.requested = self.done  # release nothing more
            self._cond.notify_all()
        self._thread = None

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the AD-PSGD averaging thread of rank {self.rank} failed: "
                               f"{type(self._error).__name__}: {self._error}") from self._error

    def _run(self) -> None:
        try:
            r = 0
            while True:
                with self._cond:
                    while self.requested <= r and not self._closing:
                        self._cond.wait()
                    if self.requested <= r:  # closing, and every released round is done
                        return
                    snapshot = self.vector.clone()
                peers = self.topology.out_peers(self.rank, r)
                received = exchange(snapshot, peers, peers, tag=r, group=self.group).wait()
                with self._cond:
                    for theirs in received:
                        self.vector.add_(theirs.sub_(snapshot), alpha=0.5)
                    r += 1
                    self.done = r
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 -- handed to the training thread, not swallowed
            with self._cond:
                self._error = exc
                self._cond.notify_all()


class ADPSGD(Decentralized):
    name = "adpsgd"
    Options = ADPSGDOptions
    options: ADPSGDOptions

    @classmethod
    def check_plan(cls, options: ADPSGDOptions, roles: Roles, model: nn.Module,
                   total_steps: int, report: Callable[[str], None], precision: str = "fp32"
                   ) -> None:
        super().check_plan(options, roles, model, total_steps, report, precision)
        if len(roles.workers) == 1:
            report("adpsgd with one worker: it has no peer to average with, so this run is plain "
                   "SGD, not AD-PSGD; launch an even number of ranks (2 or more) to measure "
                   "AD-PSGD")

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        self.setup_graph(model)
        self.step_index = 0
        self.staleness = 0.0
        self.averaging: PairwiseAveraging | None = None
        self.group = None
        if self.comm.active:
            self.group = new_group(self.comm)  # collective: every rank, same order
            vector = flatten([p.detach() for p in self.params]).clone()
            self.averaging = PairwiseAveraging(vector, self.topology, self.rank, self.group)
        self._done_at_read = 0
        return model

    def start(self, steps: range) -> None:
        if self.averaging is not None:  # after the checkpoint's parameters are in place
            self.averaging.start()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.averaging is None:
            optimizer.step()
            return
        with self.comm.timed("wait"):
            self.averaging.wait_for(self.step_index - self.options.max_lag + 1)
        with self.averaging.locked() as vector, torch.no_grad():
            if self.step_index == 0:  # no round ran yet; the parameters may have been loaded
                vector.copy_(flatten([p.detach() for p in self.params]))
            # rounds folded in since the parameters the gradient was taken at were read
            self.staleness = float(self.averaging.done - self._done_at_read)
            unflatten_into(vector, self.params)
            optimizer.step()
            vector.copy_(flatten([p.detach() for p in self.params]))
            self._done_at_read = self.averaging.done

    def after_step(self, model: nn.Module) -> None:
        if self.averaging is not None:
            self.averaging.release_round()
            if self.topology.out_peers(self.rank, self.step_index):
                # logical traffic of the round this step released: one model each way
                n = nbytes(self.averaging.vector)
                self.comm.count(sent=n, received=n)
        self.step_index += 1

    def metrics(self, model: nn.Module | None = None) -> dict[str, float]:
        if model is None:
            return {"staleness": self.staleness}
        return super().metrics(model)

    def local_vector(self, model: nn.Module) -> torch.Tensor:
        if self.averaging is None:
            return super().local_vector(model)
        with self.averaging.locked() as vector:
            return vector.clone()

    @contextmanager
    def eval_parameters(self, model: nn.Module) -> Iterator[nn.Module]:
        # Evaluate the live model, averages done since the last update included.
        if self.averaging is not None:
            with self.averaging.locked() as vector, torch.no_grad():
                unflatten_into(vector, self.params)
                self._done_at_read = self.averaging.done
        yield model

    def close(self) -> None:
        if self.averaging is None:
            return
        self.averaging.close()
        with torch.no_grad():
            unflatten_into(self.averaging.vector, self.params)
        destroy_group(self.group)
        self.averaging = self.group = None

    def abort(self) -> None:
        if self.averaging is not None:  # stop the thread; its partner may be gone
            self.averaging.abandon()
            self.averaging = None
