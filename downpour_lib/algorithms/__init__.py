"""Training algorithms, one module each, behind ``base.Algorithm``; ``ALGORITHMS`` maps name -> class.

Adding an algorithm is one module, its options, one line in ``ALGORITHMS`` and its tests:

1. **The module** (``algorithms/<name>.py``) opens with a docstring that names the method and cites
   its paper, then holds the ``Algorithm`` subclass. Its options are a frozen dataclass (a subclass
   of ``AlgorithmOptions``, one help text per field, validated in ``__post_init__`` with
   ``ConfigError``: the CLI, config files and notebooks get its fields for free) in its family's
   module of ``downpour_lib.options``, which imports no torch, and a line in ``options.OPTIONS``;
   the class names it as ``Options``.
2. **Where ranks go.** The options say it: ``roles(world_size)`` gives the ``Roles`` (who works,
   who serves, who evaluates and writes checkpoints), or a ConfigError if the algorithm cannot run
   with that many ranks, and ``roles_for(workers)`` the roles, and so the ranks to launch, for a
   number of workers. Both are pure and run before any rendezvous. By default every rank is a
   worker and rank 0 evaluates; ``options.PSOptions`` adds servers, ``GraphOptions`` the
   check that a gossip graph fits. What depends on the model, the run's length or its
   precision goes in ``check_plan``, which owns every check and warning about the options (the
   engine names none), e.g. what an asynchronous algorithm becomes with one worker. How the
   ranks stop early on a preemption signal is declared by the options too: ``stop_lag`` (the
   steps a vote may lag) or ``stop_refusal`` (they cannot); ranks that take no common steps
   (Downpour's) agree by their own messages instead (``Algorithm.points``).
3. **The step.** ``setup`` prepares the model (and returns the module to run forward on);
   ``start`` runs once the checkpoint (if any) is loaded, just before the first step;
   ``after_backward`` is the gradient side (average, push), ``step`` the update, ``after_step`` the
   parameter side (gossip, averaging, fetching). On a server rank ``setup`` returns a
   ``base.Server`` instead, whose ``serve`` loop runs in place of the steps. Communication goes
   through ``self.comm`` only, which does nothing in a world of one, so the algorithm also runs,
   and is unit-tested, in one process.
4. **State and numbers.** ``state_dict``/``load_state_dict`` for checkpoints (tensors and plain
   values); ``metrics`` adds columns to the records, after each step (no model) and at each
   evaluation (the model) (``staleness`` and ``consensus_distance`` are summarized by
   ``records``, which owns record analysis); a server reports its updates' numbers to its loop's
   ``on_update``; ``eval_parameters`` if what is evaluated is not the live model (push-sum's
   de-biased weights).
5. **Learning rate and fp16.** The engine sets the workers' optimizer to the schedule's rate
   before each step; an update made elsewhere (a server's) asks ``self.lr_at(step)``, given at
   construction with ``self.loss_scaling``. Under fp16 the options class declares how ranks agree
   to skip an overflowed step (``AlgorithmOptions.overflow``): "vote" (default: a MAX allreduce,
   the scale taken off before ``after_backward``), "reduced" (the gradients were averaged in
   backward: taken off after it, every rank finds the same), "alone" (asynchronous: a rank skips
   by itself, and its ``after_backward`` sees no gradients). A skipped step reaches ``step`` with
   no gradients.
6. **The end.** ``close`` after a run that finished (drain what is in flight, join threads) and
   ``abort`` after one that failed (stop, wait for no peer): the engine says which. Threads, if
   any, start in ``start``, and re-raise their errors in ``close``.
7. **Tests** against a reference: one process on the N-times batch for synchronous methods,
   exact averaging or conserved push-sum mass for gossip, PyTorch's own implementation where
   there is one; a multi-rank script in ``tests/mpi/`` under real ``mpiexec``.
"""

from __future__ import annotations

from typing import Any

from ..comm.collectives import Comm
from ..comm.runtime import DistContext
from ..errors import unknown_name
from ..options import build_options
from .adpsgd import ADPSGD
from .allreduce import AllReduce
from .base import Algorithm, AlgorithmOptions, Roles
from .ddp import DDP
from .diloco import DiLoCo
from .downpour import Downpour
from .dpsgd import DPSGD
from .easgd import EASGD
from .easgd_async import AsyncEASGD
from .local import Local
from .localsgd import LocalSGD
from .osgp import OSGP
from .sgp import SGP
from .slowmo import SlowMo
from .sync_ps import SyncPS

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (Local, SyncPS, DDP, AllReduce, Downpour, SGP, OSGP, DPSGD, ADPSGD,
                              LocalSGD, EASGD, DiLoCo, SlowMo)}
#: (name, ``options.variant()``) -> the class that runs it, where the options choose another
#: than the registered one: the spelling stays the algorithm's name and an option.
VARIANTS: dict[tuple[str, str], type[Algorithm]] = {("easgd", "async"): AsyncEASGD}


def algorithm_class(name: str, options: AlgorithmOptions) -> type[Algorithm]:
    """The class that runs algorithm ``name`` with ``options`` (validated)."""
    if name not in ALGORITHMS:
        raise unknown_name("algorithm", name, ALGORITHMS)
    variant = options.variant()
    return VARIANTS[name, variant] if variant and (name, variant) in VARIANTS else ALGORITHMS[name]


def make_algorithm(name: str, ctx: DistContext, **options: Any) -> Algorithm:
    """An algorithm for your own training loop: ``make_algorithm("ddp", ctx, bucket_cap_mb=4)``."""
    if name not in ALGORITHMS:
        raise unknown_name("algorithm", name, ALGORITHMS)
    built = build_options(name, ALGORITHMS[name].Options, options)
    return algorithm_class(name, built)(built, Comm(ctx))


__all__ = ["ALGORITHMS", "VARIANTS", "Algorithm", "AlgorithmOptions", "Roles", "algorithm_class",
           "make_algorithm"]
