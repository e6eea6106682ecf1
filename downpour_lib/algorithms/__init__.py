"""Training algorithms, one module each, behind ``base.Algorithm``; ``ALGORITHMS`` maps name -> class.

Adding an algorithm is one module, one line in ``ALGORITHMS`` and its tests:

1. **The module** (``algorithms/<name>.py``) opens with a docstring that names the method and cites
   its paper, then holds a frozen options dataclass (a subclass of ``AlgorithmOptions``, one help
   text per field, validated in ``__post_init__`` with ``ConfigError``: the CLI, config files and
   notebooks get its fields for free) and the ``Algorithm`` subclass.
2. **Where ranks go.** By default every rank is a worker and rank 0 evaluates and writes
   checkpoints. An algorithm with servers, or with a world it cannot run in, says so in ``roles``,
   ``world_size_for`` and ``check_world`` (pure functions of the options and the world size, run
   before any rendezvous) and, for what depends on the model, ``check_plan``.
3. **The step.** ``setup`` prepares the model (and returns the module to run forward on);
   ``after_backward`` is the gradient side (average, push), ``step`` the update, ``after_step`` the
   parameter side (gossip, averaging, fetching); a server rank runs ``serve``. Communication goes
   through ``self.comm`` only, which does nothing in a world of one, so the algorithm also runs,
   and is unit-tested, in one process.
4. **State and numbers.** ``state_dict``/``load_state_dict`` for checkpoints (tensors and plain
   values); ``step_metrics``/``eval_metrics`` add columns to the records (``staleness`` and
   ``consensus_distance`` are summarized by ``records``, which owns record analysis);
   ``eval_parameters`` if what is evaluated is not the live model (push-sum's de-biased weights).
5. **The end.** ``close`` after a run that finished (drain what is in flight, join threads) and
   ``abort`` after one that failed (stop, wait for no peer): the engine says which. Threads, if
   any, start in ``setup`` or later, never in a constructor, and re-raise their errors in
   ``close``.
6. **Tests** against a reference: one process on the N-times batch for synchronous methods,
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
from .downpour import Downpour
from .dpsgd import DPSGD
from .local import Local
from .osgp import OSGP
from .sgp import SGP
from .sync_ps import SyncPS

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (Local, SyncPS, DDP, AllReduce, Downpour, SGP, OSGP, DPSGD, ADPSGD)}


def make_algorithm(name: str, ctx: DistContext, **options: Any) -> Algorithm:
    """An algorithm for your own training loop: ``make_algorithm("ddp", ctx, bucket_cap_mb=4)``."""
    if name not in ALGORITHMS:
        raise unknown_name("algorithm", name, ALGORITHMS)
    cls = ALGORITHMS[name]
    opts = build_options(name, cls.Options, options)
    cls.check_world(opts, ctx.world_size)
    return cls(opts, Comm(ctx))


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmOptions", "Roles", "make_algorithm"]
