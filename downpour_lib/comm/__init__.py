"""Every torch.distributed call lives here: the runtime, metered collectives, the DDP wrapper, and the
collectives API (``allreduce``, ``broadcast``, ``reduce``, ``allgather``, ``reduce_scatter``, sync or
async with a ``Handle``), communicators and groups, and the model helpers.

    from downpour_lib import comm
    handle = comm.allreduce([w.grad for w in weights], op="mean", async_op=True)
    ...
    handle.wait()
"""

from .communicator import (
    Communicator,
    allgather,
    allreduce,
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
    "Communicator", "Handle", "Hierarchy", "ModelMismatchError", "allgather", "allreduce",
    "broadcast", "new_group", "node_groups", "node_leaders", "reduce", "reduce_scatter",
    "shard_bounds", "split", "synchronize_gradients", "synchronize_parameters", "world",
]
