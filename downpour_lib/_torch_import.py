"""Import torch for a training process with Python's cyclic garbage collector paused.

A rank's start is mostly imports: torch (about half a million objects that live as long as the
process), and ``torch._dynamo`` with sympy, which ``torch.optim``'s first ``step`` imports whatever
the run (``_use_grad_for_differentiable`` calls ``torch._dynamo.graph_break``). With the collector
on, its full collections walk that growing heap again and again while it is built, and once more
at exit. Paused for the imports and then frozen (``gc.freeze``: kept out of every later
collection, as CPython advises before a fork), the same start and exit cost a third less CPU:
6.3 -> 4.3 CPU-s a process here, on the 2 cores where the ranks of a job share them.

Called by the entry points (``downpour train`` and ``bench``, a batch of runs, an engine as it
connects and as it first trains, the tests' rank scripts and pytest); importing the library does
none of it. Stdlib only here.
"""

from __future__ import annotations

import gc
import importlib
import sys


def import_torch(*, training: bool = True) -> None:
    """Import torch and torch.distributed (and torch._dynamo for a process that will step an
    optimizer: ``training``) with the collector paused, then freeze what exists. Whatever is
    already imported is not again, and the collector's state is left as found."""
    names = ["torch", "torch.distributed"] + (["torch._dynamo"] if training else [])
    missing = [name for name in names if name not in sys.modules]
    if not missing:
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for name in missing:
            importlib.import_module(name)
    finally:
        # No gc.collect() first: it would free ~9,000 objects (well under 1% of the heap) for
        # 0.25 CPU-s. Objects made from here on are collected as usual.
        gc.freeze()
        if was_enabled:
            gc.enable()
