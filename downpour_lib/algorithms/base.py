"""The small interface every training algorithm implements.

Two plug-in points, as in torch.distributed.algorithms: ``after_backward`` on the gradient side and
``after_step`` on the parameter side, plus ``step`` (the update) and ``serve`` (a server rank's loop).
Algorithms communicate only through ``comm.Comm``, so with a world of one they run in a unit test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from ..comm.collectives import Comm
from ..options import AlgorithmOptions, Roles
from ..preempt import Control, StepVote, Stopper, StopSignal, Unstoppable


class Algorithm:
    """Default behaviour: every rank is a worker and steps its own optimizer.

    The life of one run: ``setup`` (on every rank, collective), the checkpoint's state loaded
    (``load_state_dict``, on resume), ``start``, then the steps (a worker) or ``serve`` (a server),
    then ``close`` if the run finished or ``abort`` if it failed. Who works, serves and evaluates
    is ``self.roles``, which the options produce (``AlgorithmOptions.roles``)."""

    name: ClassVar[str]
    Options: ClassVar[type[AlgorithmOptions]] = AlgorithmOptions
    #: fp16: how the ranks agree to skip a step whose gradients overflowed, one declaration the
    #: engine reads. "vote": the loss scale comes off before ``after_backward`` and every rank
    #: skips if any overflowed (a MAX allreduce of 4 bytes, ``vote_overflow``); "reduced": the
    #: gradients are averaged during backward (bucketed allreduce, DDP), so the scale comes off
    #: after ``after_backward`` and every rank finds the same; "alone": no rank steps with
    #: another (asynchronous), the scale comes off before ``after_backward`` and a rank that
    #: overflowed skips alone: its ``after_backward`` and ``step`` see no gradients.
    overflow: ClassVar[Literal["vote", "reduced", "alone"]] = "vote"
    #: What the algorithm becomes with one worker, where that is not what its name promises
    #: (``check_plan`` reports it): every algorithm runs at world size 1, but an asynchronous
    #: one then has nothing to be asynchronous with.
    one_worker: ClassVar[str] = ""

    def __init__(self, options: AlgorithmOptions, comm: Comm,
                 lr_at: Callable[[int], float] | None = None, loss_scaling: bool = False) -> None:
        """``lr_at``: the run's learning rate at each step, for an update made away from the
        workers' optimizer (a server's; None: the optimizer's own rate); ``loss_scaling``: fp16
        loss scaling is on (``precision``), so a server joins the workers' overflow vote."""
        self.options, self.comm = options, comm
        self.lr_at, self.loss_scaling = lr_at, loss_scaling
        self.rank, self.world_size = comm.rank, comm.size
        self.roles: Roles = options.roles(comm.size)  # ConfigError if the world does not fit

    @classmethod
    def check_plan(cls, options: Any, roles: Roles, model: nn.Module, total_steps: int,
                   report: Callable[[str], None], precision: str = "fp32") -> None:
        """Every check and warning about these options for this run, before any rank talks to
        another: raise ConfigError if they cannot work with this model (built on the meta device,
        so the check allocates nothing), run length or ``precision``, e.g. more parameter shards
        than tensors; ``report`` what is legal but pointless. Overrides call this one."""
        if len(roles.workers) == 1 and cls.one_worker:
            report(f"{cls.name} with one worker: {cls.one_worker}")

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        """Prepare the model; return the module the engine runs forward on (may be a wrapper)."""
        return model

    def start(self, steps: range) -> None:
        """On every rank, once set up and restored from the checkpoint, just before the first
        step (a worker) or ``serve`` (a server): the run's steps are ``steps`` (``steps.start >
        0`` on resume). Threads that run beside the steps start here."""

    def after_backward(self, model: nn.Module) -> None:
        """Gradient side: runs once backward has produced every gradient."""

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
        ``control`` is a group of every rank for the purpose), as the options declare it
        (``AlgorithmOptions.stop_lag``, ``stop_refusal``): votes a fraction of a second apart,
        each read at least ``stop_lag`` steps later, so every rank stops after the same step.
        An algorithm whose ranks do not take the same steps (Downpour) agrees by its messages."""
        why = self.options.stop_refusal()
        if why is not None:
            return Unstoppable(signal, why)
        return StepVote(control, signal, lag=self.options.stop_lag)

    def close(self) -> None:
        """The run finished on every rank (or stopped early where ``stopper`` agreed): finish
        what is still in flight (this may communicate), join threads, release what ``setup``
        took. The engine calls it after the last step; a training loop of your own calls it too."""

    def abort(self) -> None:
        """The run failed, on this rank or another, and the job is being taken down: stop threads
        and release what ``setup`` took, waiting for no peer (one may be gone, and a peer waiting
        for this rank would make it wait in turn). Called instead of ``close``."""


def vote_overflow(comm: Comm, found: bool) -> bool:
    """fp16, ``Algorithm.overflow == "vote"``: whether any rank's gradients overflowed this step,
    given whether they did here (``found``): a MAX allreduce of the finding over every rank. A
    server that steps with the workers joins it with ``found=False``."""
    if not comm.active:
        return found
    flag = torch.tensor([float(found)], device=comm.ctx.device)
    comm.allreduce(flag, op="max")
    return bool(flag.item())
