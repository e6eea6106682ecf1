"""The small interface every training algorithm implements.

Two plug-in points, as in torch.distributed.algorithms: ``after_backward`` on the gradient side and
``after_step`` on the parameter side, plus ``step`` (the update) and ``serve`` (a server rank's loop).
Algorithms communicate only through ``comm.Comm``, so with a world of one they run in a unit test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import nn

from ..comm.collectives import Comm
from ..options import AlgorithmOptions, Roles
from ..preempt import Control, StepVote, Stopper, StopSignal


class Algorithm:
    """Default behaviour: every rank is a worker and steps its own optimizer.

    The life of one run: ``setup`` (on every rank, collective), the checkpoint's state loaded
    (``load_state_dict``, on resume), ``start``, then the steps (a worker) or ``serve`` (a server),
    then ``close`` if the run finished or ``abort`` if it failed. Who works, serves and evaluates
    is ``self.roles``, which the options produce (``AlgorithmOptions.roles``)."""

    name: ClassVar[str]
    Options: ClassVar[type[AlgorithmOptions]] = AlgorithmOptions
    #: Whether the gradients are averaged during backward (bucketed allreduce, DDP): fp16's loss
    #: scale is then taken off after ``after_backward``, otherwise before it.
    reduces_in_backward: ClassVar[bool] = False
    #: Set by the engine before ``setup``: the learning rate of each step (an algorithm whose
    #: updates happen away from the workers' optimizer, on servers, applies it there; None: the
    #: optimizer's own), and whether fp16 loss scaling is on (``precision``).
    lr_at: Callable[[int], float] | None = None
    loss_scaling: bool = False
    #: What the algorithm becomes with one worker, where that is not what its name promises
    #: (``plan_run`` warns with it): every algorithm runs at world size 1, but an asynchronous
    #: one then has nothing to be asynchronous with.
    one_worker: ClassVar[str] = ""

    def __init__(self, options: AlgorithmOptions, comm: Comm) -> None:
        self.options, self.comm = options, comm
        self.rank, self.world_size = comm.rank, comm.size
        self.roles: Roles = options.roles(comm.size)  # ConfigError if the world does not fit

    @classmethod
    def check_plan(cls, options: Any, roles: Roles, model: nn.Module, total_steps: int) -> None:
        """Raise ConfigError if the options cannot work with this model (built on the meta
        device, so the check allocates nothing) and run length, e.g. more parameter shards
        than tensors."""

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        """Prepare the model; return the module the engine runs forward on (may be a wrapper)."""
        return model

    def start(self, steps: range) -> None:
        """On every rank, once set up and restored from the checkpoint, just before the first
        step (a worker) or ``serve`` (a server): the run's steps are ``steps`` (``steps.start >
        0`` on resume). Threads that run beside the steps start here."""

    def after_backward(self, model: nn.Module) -> None:
        """Gradient side: runs once backward has produced every gradient."""

    def overflowed(self, found: bool) -> bool:
        """fp16: whether this step's gradients overflowed on any rank that steps with this one,
        given whether they did here (``found``); every such rank then skips the step. Default: a
        MAX allreduce of the finding over every rank (4 bytes, only under fp16). Algorithms whose
        ranks all hold the same gradients, or step alone, override it with the local finding."""
        if not self.comm.active:
            return found
        flag = torch.tensor([float(found)], device=self.comm.ctx.device)
        self.comm.allreduce(flag, op="max")
        return bool(flag.item())

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def after_step(self, model: nn.Module) -> None:
        """Parameter side: runs after the update (gossip, averaging, fetching)."""

    def serve(self, steps: range, on_update: Callable[[int, int | None], None]) -> None:
        """A server rank's loop over the workers' ``steps`` of this run. After each update it
        applies it calls ``on_update(update, step)``: ``update`` counts from 0; ``step`` is the
        workers' step the update completes when servers and workers step together (an
        evaluation and checkpoint point, as for every rank), None for an asynchronous server."""
        raise NotImplementedError(f"{self.name} has no server ranks")

    def step_metrics(self) -> dict[str, float]:
        """Extra numbers for the step (or server update) just finished, e.g. staleness."""
        return {}

    def eval_metrics(self, model: nn.Module) -> dict[str, float]:
        """Extra numbers at an evaluation point, e.g. consensus distance. Called on every rank at
        the same step, so it may use collectives (if the algorithm's ranks share step indices)."""
        return {}

    @contextmanager
    def eval_parameters(self, model: nn.Module) -> Iterator[nn.Module]:
        """The module to evaluate (e.g. de-biased parameters for push-sum)."""
        yield model

    def state_dict(self) -> dict[str, Any]:
        """This rank's algorithm state for a checkpoint (tensors and plain values only)."""
        return {}

    def collect_states(self, local: Callable[[], dict[str, Any]], final: bool
                       ) -> dict[int, dict[str, Any]] | None:
        """At a checkpoint point: every rank's state (``local()`` on each, see
        ``checkpoint.rank_state``), by rank, on the rank that writes the checkpoint (the
        evaluator); None on the others. Every rank reaches the same checkpoint points here, so
        the default gathers collectively; an asynchronous algorithm fetches what other ranks
        hold by message instead. ``final``: training is over on every rank."""
        parts = self.comm.gather_object(local(), root=self.roles.evaluator)
        return None if parts is None else dict(enumerate(parts))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def stopper(self, control: Control | None, signal: StopSignal) -> Stopper:
        """How this algorithm's ranks agree to stop early when ``signal`` arrives (preemption;
        ``control`` is a group of every rank for the purpose). Default: votes a fraction of a
        second apart, each read at least ``stop_lag`` steps later, so every rank stops after the
        same step; right where every rank takes the same steps. An algorithm whose ranks do not
        (Downpour) agrees by its messages."""
        return StepVote(control, signal, lag=self.stop_lag)

    #: The fewest steps between a vote and its reading (``stopper``): 1 costs no waiting where
    #: ranks step together; an algorithm that lets ranks drift apart gives its bound.
    stop_lag: int = 1

    def close(self) -> None:
        """The run finished on every rank (or stopped early where ``stopper`` agreed): finish
        what is still in flight (this may communicate), join threads, release what ``setup``
        took. The engine calls it after the last step; a training loop of your own calls it too."""

    def abort(self) -> None:
        """The run failed, on this rank or another, and the job is being taken down: stop threads
        and release what ``setup`` took, waiting for no peer (one may be gone, and a peer waiting
        for this rank would make it wait in turn). Called instead of ``close``."""
