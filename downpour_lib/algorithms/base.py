"""The small interface every training algorithm implements.

Two plug-in points, as in torch.distributed.algorithms: ``after_backward`` on the gradient side and
``after_step`` on the parameter side, plus ``step`` (the update). A rank whose role is "server" gets
a ``Server`` from ``setup`` instead of a module, and runs its ``serve`` loop instead of the steps.
What the options decide is declared on them (``AlgorithmOptions``: the roles, the stop policy,
how fp16 ranks agree to skip a step), not on the algorithm. Algorithms communicate only through
``comm.Comm``, so with a world of one they run in a unit test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import nn

from ..comm.collectives import Comm
from ..options import AlgorithmOptions, Roles
from ..preempt import Stopper, StopSignal

#: ``Server.serve``'s report after each update it applies: (update, step, metrics), see there.
OnUpdate = Callable[[int, "int | None", dict[str, float]], None]


class Server:
    """A server rank's part of a run: what ``Algorithm.setup`` returns on a rank whose role is
    "server" (``Roles.role``), in place of the module a worker runs forward on. A rank that both
    works and serves (colocated) is a worker: its algorithm serves beside its steps."""

    def serve(self, steps: range, on_update: OnUpdate) -> None:
        """The loop over the workers' ``steps`` of this run. After each update it applies it calls
        ``on_update(update, step, metrics)``: ``update`` counts from 0; ``step`` is the workers'
        step the update completes when servers and workers step together (an evaluation and
        checkpoint point, as for every rank), None for an asynchronous server; ``metrics`` the
        update's numbers for its record (e.g. staleness)."""
        raise NotImplementedError


class Points:
    """How ranks that take no common steps (Downpour's) meet at their points by their own
    messages: whether to stop early, and what a checkpoint holds. Ranks that step together need
    none (``Algorithm.points`` is None): they vote to stop as their options declare
    (``AlgorithmOptions.stop_lag``, ``stop_refusal``) and gather a checkpoint's states together."""

    def stopper(self, signal: StopSignal) -> Stopper:
        """How a rank stops early when ``signal`` (a preemption) arrives here or is heard."""
        raise NotImplementedError

    def collect_states(self, local: Callable[[], dict[str, Any]], final: bool
                       ) -> dict[int, dict[str, Any]] | None:
        """At a checkpoint point: every rank's state, by rank, on the rank that writes the
        checkpoint (the evaluator; ``local()`` is this rank's, ``checkpoint.rank_state``); None
        on the others. ``final``: no rank trains after this checkpoint."""
        raise NotImplementedError


class Algorithm:
    """Default behaviour: every rank is a worker and steps its own optimizer.

    The life of one run: ``setup`` (on every rank, collective), the checkpoint's state loaded
    (``load_state_dict``, on resume), ``start``, then the steps (a worker) or the ``Server``'s
    loop (a server), then ``close`` if the run finished or ``abort`` if it failed. Who works,
    serves and evaluates is ``self.roles``, which the options produce (``AlgorithmOptions.roles``)."""

    name: ClassVar[str]
    Options: ClassVar[type[AlgorithmOptions]] = AlgorithmOptions
    #: Set by ``setup`` where the ranks take no common steps, so they cannot vote to stop or
    #: gather a checkpoint together (Downpour's, by its servers' messages); None: they can.
    points: Points | None = None

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
        than tensors; ``report`` what is legal but pointless (e.g. an asynchronous algorithm
        with one worker, which has nothing to be asynchronous with). Overrides call this one."""
        period = getattr(options, "period", None)  # localsgd, easgd, diloco, slowmo
        if isinstance(period, int) and period > total_steps and not getattr(options, "sync_steps", 0):
            report(f"period={period} is longer than the run's {total_steps} steps: the workers never "
                   f"meet (nothing is averaged); give a period of at most {total_steps}, or more steps")

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module | Server:
        """Prepare the model; return the module the engine runs forward on (may be a wrapper),
        or on a server rank the ``Server`` it runs."""
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

    def metrics(self, model: nn.Module | None = None) -> dict[str, float]:
        """Extra numbers for the records. ``model`` None: the step just finished, e.g. staleness.
        A ``model``: an evaluation point, e.g. consensus distance; called on every rank at the
        same step, so it may use collectives (if the algorithm's ranks share step indices)."""
        return {}

    @contextmanager
    def eval_parameters(self, model: nn.Module) -> Iterator[nn.Module]:
        """The module to evaluate (e.g. de-biased parameters for push-sum)."""
        yield model

    def state_dict(self) -> dict[str, Any]:
        """This rank's algorithm state for a checkpoint (tensors and plain values only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        """The run finished on every rank (or stopped early where the ranks agreed to): finish
        what is still in flight (this may communicate), join threads, release what ``setup``
        took. The engine calls it after the last step; a training loop of your own calls it too."""

    def abort(self) -> None:
        """The run failed, on this rank or another, and the job is being taken down: stop threads
        and release what ``setup`` took, waiting for no peer (one may be gone, and a peer waiting
        for this rank would make it wait in turn). Called instead of ``close``."""


def vote_overflow(comm: Comm, found: bool) -> bool:
    """fp16, ``AlgorithmOptions.overflow == "vote"``: whether any rank's gradients overflowed this step,
    given whether they did here (``found``): a MAX allreduce of the finding over every rank. A
    server that steps with the workers joins it with ``found=False``."""
    if not comm.active:
        return found
    flag = torch.tensor([float(found)], device=comm.ctx.device)
    comm.allreduce(flag, op="max")
    return bool(flag.item())
