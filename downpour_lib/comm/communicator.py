"""Collectives on a group of ranks, synchronous or asynchronous, on one tensor or a list of tensors.

This is the TorchMPI-style API (Tran et al. 2016, TorchMPI: "MPI for Torch"): a ``Communicator``
(the world, or any group made in ``comm.groups``) offers allreduce, broadcast, reduce, allgather and
reduce_scatter. Each takes a tensor or a list of tensors; a list travels as one flat buffer (one
message instead of many) and is copied back into its tensors when the collective is done (an
allreduce on the ``mpi`` backend skips the flat buffer: it gathers the tensors itself). With
``async_op=True`` a call returns a ``Handle`` at once; ``handle.wait()`` finishes it and returns what
the synchronous call would have returned. In a world (or group) of one every collective is a no-op,
so code written against this API runs unchanged in a single process.

Ranks given to a communicator's methods (``root``) are ranks within the communicator; results that
list the members (``allgather``) are in the members' order, which is ascending global rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist

from .collectives import flatten, unflatten_into
from .handles import Handle

Op = Literal["sum", "mean", "max", "min", "product"]
Tensors = torch.Tensor | Sequence[torch.Tensor]

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
               "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}


def reduce_op(op: str) -> dist.ReduceOp:
    """The backend's op for ``op``. "mean" is a sum divided afterwards (gloo and MPI have no AVG)."""
    if op not in _REDUCE_OPS:
        raise ValueError(f"op={op!r} is not valid: choose one of {', '.join(_REDUCE_OPS)}")
    return _REDUCE_OPS[op]


def pack(x: Tensors, *, copy: bool = False) -> tuple[torch.Tensor, Callable[[], None]]:
    """``x`` as one contiguous buffer, and the function that puts the buffer's contents back.

    A contiguous tensor is its own buffer (nothing to put back) unless ``copy`` asks for a private
    one; a list is flattened into a new buffer (its tensors must share a dtype and a device).
    """
    if isinstance(x, torch.Tensor):
        buf = x.contiguous()
        if copy and buf is x:
            buf = x.clone()
        if buf is x:
            return x, _nothing
        return buf, lambda: x.copy_(buf.view_as(x))
    tensors = check_tensors(x)
    buf = flatten(tensors)
    return buf, lambda: unflatten_into(buf, tensors)


def check_tensors(x: Tensors) -> list[torch.Tensor]:
    """The tensors of ``x`` (a tensor or a list); a list must share one dtype and one device."""
    if isinstance(x, torch.Tensor):
        return [x]
    tensors = list(x)
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("give a tensor or a non-empty list of tensors")
    kinds = {(t.dtype, t.device) for t in tensors}
    if len(kinds) > 1:
        raise TypeError("a list sent as one buffer needs one dtype and one device; got "
                        + ", ".join(f"{d} on {v}" for d, v in sorted(kinds, key=str))
                        + " (split the list by dtype)")
    return tensors


def _nothing() -> None:
    pass


def shard_bounds(numel: int, size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of ``rank``'s shard when ``numel`` elements are padded to a multiple of ``size``
    and cut into ``size`` equal shards (what ``reduce_scatter`` does to a list); stop may pass numel."""
    per = -(-numel // size)
    return rank * per, (rank + 1) * per


class Communicator:
    """A group of ranks seen from one of them. ``rank`` is None on ranks outside the group."""

    def __init__(self, ranks: Sequence[int], group: dist.ProcessGroup | None, my_rank: int) -> None:
        self.ranks = tuple(sorted(ranks))  # torch numbers group members by ascending global rank
        self.group = group  # None: the default (world) group, or no process group at all
        self.size = len(self.ranks)
        self.rank = self.ranks.index(my_rank) if my_rank in self.ranks else None

    @classmethod
    def world(cls) -> Communicator:
        """Every rank of the job (a world of one when no process group was created)."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls((0,), None, 0)
        return cls(range(dist.get_world_size()), None, dist.get_rank())

    def __repr__(self) -> str:
        return f"Communicator(ranks={self.ranks}, rank={self.rank})"

    @property
    def active(self) -> bool:
        """Whether collectives communicate at all (more than one member)."""
        return self.size > 1

    @property
    def member(self) -> bool:
        return self.rank is not None

    def global_rank(self, rank: int) -> int:
        if not 0 <= rank < self.size:
            raise ValueError(f"root={rank} is not valid: this communicator's ranks are "
                             f"0..{self.size - 1}")
        return self.ranks[rank]

    # -- collectives ----------------------------------------------------------------------------

    def allreduce(self, x: Tensors, op: Op = "sum", async_op: bool = False) -> Any:
        """Reduce ``x`` over the members, leaving the result in ``x`` on every member; returns ``x``."""
        red = reduce_op(op)
        if not self._begin(x, op):
            return self._done(x, async_op)
        if not isinstance(x, torch.Tensor) and self.gathers_lists:
            tensors = check_tensors(x)
            opts = dist.AllreduceCoalescedOptions()
            opts.reduceOp = dist.ReduceOp.AVG if op == "mean" else red
            opts.asyncOp = True
            work = self._process_group().allreduce_coalesced(tensors, opts)
            return self._complete(Handle([work], None, x), async_op)
        buf, write_back = pack(x)
        work = dist.all_reduce(buf, op=red, group=self.group, async_op=True)
        return self._finish([work], buf, write_back, x, op, async_op)

    @property
    def gathers_lists(self) -> bool:
        """Whether the backend reduces a list of tensors where they lie, with no flat copy first
        (the ``mpi`` backend of ``comm.mpi`` gathers them into its shared memory itself);
        elsewhere a list is packed into one buffer and copied back."""
        return self.active and getattr(self._process_group(), "gathers_lists", False)

    def _process_group(self) -> dist.ProcessGroup:
        return self.group if self.group is not None else dist.distributed_c10d._get_default_group()

    def broadcast(self, x: Tensors, root: int = 0, async_op: bool = False) -> Any:
        """Copy ``x`` from member ``root`` into ``x`` on every member; returns ``x``."""
        src = self.global_rank(root)
        if not self._begin(x):
            return self._done(x, async_op)
        buf, write_back = pack(x)
        work = dist.broadcast(buf, src=src, group=self.group, async_op=True)
        if self.rank == root:
            write_back = _nothing
        return self._finish([work], buf, write_back, x, "sum", async_op)

    def reduce(self, x: Tensors, root: int = 0, op: Op = "sum", async_op: bool = False) -> Any:
        """Reduce ``x`` into member ``root``'s ``x``; the other members' ``x`` is left as it was."""
        dst, red = self.global_rank(root), reduce_op(op)
        if not self._begin(x, op):
            return self._done(x, async_op)
        # Backends may scribble on a non-root's buffer: give them a private one.
        buf, write_back = pack(x, copy=self.rank != root)
        work = dist.reduce(buf, dst=dst, op=red, group=self.group, async_op=True)
        if self.rank != root:
            write_back, op = _nothing, "sum"
        return self._finish([work], buf, write_back, x, op, async_op)

    def allgather(self, x: Tensors, async_op: bool = False) -> Any:
        """Every member's ``x`` (same shapes on all), as a list in member order. For a tensor each
        entry is a tensor shaped like it; for a list each entry is a list shaped like it."""
        if not self._begin(x):
            return self._done([x if isinstance(x, torch.Tensor) else list(x)], async_op)
        buf, _ = pack(x)
        out = buf.new_empty(self.size * buf.numel())
        work = dist.all_gather_single(out, buf.reshape(-1), group=self.group, async_op=True)
        if isinstance(x, torch.Tensor):
            result: list = list(out.view(self.size, *x.shape).unbind(0))
        else:
            tensors = list(x)
            result = [unflatten_views(part, tensors) for part in out.chunk(self.size)]
        return self._complete(Handle([work], result=result), async_op)

    def reduce_scatter(self, x: Tensors, op: Op = "sum", async_op: bool = False) -> Any:
        """Reduce ``x`` over the members and give each member its part of the result.

        For a tensor, dim 0 must divide by the group size and member i gets chunk i along dim 0. For
        a list, the tensors are flattened, zero-padded to a multiple of the group size, and member i
        gets the 1-D shard ``shard_bounds(total numel, size, i)`` of the reduced buffer.
        """
        red = reduce_op(op)
        if isinstance(x, torch.Tensor) and (x.dim() == 0 or x.shape[0] % self.size):
            raise ValueError(f"reduce_scatter of a tensor needs dim 0 divisible by the group size "
                             f"{self.size}; got shape {tuple(x.shape)} (pass a list to have it "
                             "flattened and padded)")
        if not self._begin(x, op):
            return self._done(x if isinstance(x, torch.Tensor) else flatten(list(x)), async_op)
        if isinstance(x, torch.Tensor):
            buf = x.contiguous()
            out = buf.new_empty((x.shape[0] // self.size, *x.shape[1:]))
        else:
            flat, _ = pack(x)
            start, stop = shard_bounds(flat.numel(), self.size, 0)
            per = stop - start
            buf = flat.new_zeros(per * self.size)
            buf[:flat.numel()] = flat
            out = buf.new_empty(per)
        work = dist.reduce_scatter_single(out, buf, op=red, group=self.group, async_op=True)
        return self._finish([work], out, _nothing, out, op, async_op)

    # -- objects and synchronization ----------------------------------------------------------------

    def allgather_object(self, obj: Any) -> list[Any]:
        """Every member's picklable ``obj``, in member order."""
        if not self._begin(None):
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        if self._begin(None):
            dist.barrier(group=self.group)

    # -- plumbing -----------------------------------------------------------------------------------

    def _begin(self, x: Tensors | None, op: str = "sum") -> bool:
        """Check the call; False when there is nothing to communicate (a group of one)."""
        if not self.member:
            raise RuntimeError(f"this rank is not a member of {self!r}; only its members may call "
                               "its collectives")
        if x is not None:
            first = check_tensors(x)[0]
            if op == "mean" and not first.is_floating_point():
                raise TypeError(f"op='mean' needs floating-point tensors, got {first.dtype}")
        return self.active

    @staticmethod
    def _done(result: Any, async_op: bool) -> Any:
        return Handle.completed(result) if async_op else result

    def _finish(self, works: list, buf: torch.Tensor, write_back: Callable[[], None], result: Any,
                op: str, async_op: bool) -> Any:
        size = self.size

        def finish() -> None:
            if op == "mean":
                buf.div_(size)
            write_back()

        return self._complete(Handle(works, finish, result), async_op)

    @staticmethod
    def _complete(handle: Handle, async_op: bool) -> Any:
        return handle if async_op else handle.wait()


def unflatten_views(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views into ``flat`` shaped like ``like`` (no copy)."""
    out, offset = [], 0
    for t in like:
        out.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return out


# -- the same collectives as functions, on the world unless a group is given -----------------------

def world() -> Communicator:
    """The communicator of every rank in the job."""
    return Communicator.world()


def allreduce(x: Tensors, op: Op = "sum", async_op: bool = False,
              group: Communicator | None = None) -> Any:
    return (group or world()).allreduce(x, op=op, async_op=async_op)


def broadcast(x: Tensors, root: int = 0, async_op: bool = False,
              group: Communicator | None = None) -> Any:
    return (group or world()).broadcast(x, root=root, async_op=async_op)


def reduce(x: Tensors, root: int = 0, op: Op = "sum", async_op: bool = False,
           group: Communicator | None = None) -> Any:
    return (group or world()).reduce(x, root=root, op=op, async_op=async_op)


def allgather(x: Tensors, async_op: bool = False, group: Communicator | None = None) -> Any:
    return (group or world()).allgather(x, async_op=async_op)


def reduce_scatter(x: Tensors, op: Op = "sum", async_op: bool = False,
                   group: Communicator | None = None) -> Any:
    return (group or world()).reduce_scatter(x, op=op, async_op=async_op)
