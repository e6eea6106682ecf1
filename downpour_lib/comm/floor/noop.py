"""The do-nothing backend: a process group whose collectives do nothing and complete at once.

Through torch.distributed it takes what torch's dispatch into a Python backend takes and nothing
else: the floor that no backend of this kind can go under (``downpour bench collectives
--breakdown``'s ``noop`` column). Registered as ``downpour_noop`` the first time a group of it is
made, through torch's public extension API, as the ``mpi`` backend registers (``comm/mpi/backend.py``).
"""

from __future__ import annotations

import torch.distributed as dist

NAME = "downpour_noop"


class NoopGroup(dist.ProcessGroup):
    """A process group whose collectives do nothing and complete at once, returning no work: the
    least a backend can return (torch's synchronous collectives take None, from backends that
    synchronize in C++; the ``mpi`` backend's short paths return it too)."""

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)

    def getBackendName(self) -> str:
        return "noop"

    def _done(self, *_args, **_kwargs) -> None:
        return None

    allreduce = broadcast = reduce = _done
    allgather = all_gather_single = _allgather_base = _done
    reduce_scatter = reduce_scatter_single = _reduce_scatter_base = _done


def noop_group() -> dist.ProcessGroup:
    """A ``NoopGroup`` over every rank, made the way torch makes any group of a registered backend
    (torch refuses a group object it did not make). Collective: every rank calls it."""
    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(
            NAME, lambda opts, _: NoopGroup(opts.group_rank, opts.group_size), extended_api=True,
            devices=["cpu"])
    return dist.new_group(backend=NAME)
