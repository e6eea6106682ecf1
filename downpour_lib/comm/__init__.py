"""Every torch.distributed call lives here: the runtime, the ``mpi`` backend (``comm.mpi``), the
collectives API (``allreduce``, ``broadcast``, ``reduce``, ``allgather``, ``reduce_scatter``, sync or
async with a ``Handle``) on communicators and groups, metered (``Comm``, what algorithms use) or not,
the DDP wrapper, gossip and point-to-point messages, and the model helpers.

    from downpour_lib import comm
    handle = comm.allreduce([w.grad for w in weights], op="mean", async_op=True)
    ...
    handle.wait()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .collectives import (
        Comm,
        Communicator,
        allgather,
        allreduce,
        alltoall,
        broadcast,
        reduce,
        reduce_scatter,
        shard_bounds,
        world,
    )
    from .groups import Hierarchy, new_group, node_groups, node_leaders, split
    from .handles import Handle
    from .model_sync import ModelMismatchError, synchronize_gradients, synchronize_parameters

__all__ = [
    "Comm", "Communicator", "Handle", "Hierarchy", "ModelMismatchError", "allgather", "allreduce",
    "alltoall", "broadcast", "new_group", "node_groups", "node_leaders", "reduce", "reduce_scatter",
    "shard_bounds", "split", "synchronize_gradients", "synchronize_parameters", "world",
]

# Loaded on first use, as the package's own names are (``downpour_lib/__init__``): the modules
# here that need no torch (``traffic``, ``launch_env``, ``addresses``) serve commands that never
# import it, such as ``downpour model predict``.
_WHERE = {name: ".collectives" for name in (
    "Comm", "Communicator", "allgather", "allreduce", "alltoall", "broadcast", "reduce",
    "reduce_scatter", "shard_bounds", "world")}
_WHERE.update({name: ".groups" for name in ("Hierarchy", "new_group", "node_groups", "node_leaders",
                                            "split")})
_WHERE.update({"Handle": ".handles", "ModelMismatchError": ".model_sync",
               "synchronize_gradients": ".model_sync", "synchronize_parameters": ".model_sync"})


def __getattr__(name: str):
    if name not in _WHERE:  # a submodule (`from downpour_lib.comm import runtime`) imports as usual
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value
