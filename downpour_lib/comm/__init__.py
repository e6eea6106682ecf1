"""Every torch.distributed call lives here: the runtime, the ``mpi`` backend (``comm.mpi``), the
bench's two yardstick backends (``comm.floor``: a do-nothing one and a native C++ floor), the
collectives API (``allreduce``, ``broadcast``, ``reduce``, ``allgather``, ``reduce_scatter``, sync or
async with a ``Handle``) on communicators and groups, metered (``Comm``, what algorithms use) or not,
the DDP wrapper, gossip and point-to-point messages, and the model helpers.

    from downpour_lib import comm
    handle = comm.allreduce([w.grad for w in weights], op="mean", async_op=True)
    ...
    handle.wait()
"""

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
