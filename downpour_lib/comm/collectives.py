"""Collectives on a group of ranks: synchronous or asynchronous, on one tensor or a list, metered or
not, and no-ops in a world of one. Algorithms, the model helpers and users all go through here.

This is the TorchMPI-style API (Tran et al. 2016, TorchMPI: "MPI for Torch"): a ``Communicator``
(the world, or any group made in ``comm.groups``) offers allreduce, broadcast, reduce, allgather,
reduce_scatter and alltoall. Each takes a tensor or (but alltoall) a list of tensors; a list travels
as one flat buffer (one message instead of many) and is copied back into its tensors when the
collective is done (an allreduce on the ``mpi`` backend skips the flat buffer: it gathers the tensors
itself). With ``async_op=True`` a call returns a ``Handle`` at once; ``handle.wait()`` finishes it
and returns what the synchronous call would have returned. In a world (or group) of one every
collective is a no-op that returns the same, so code written against this API runs unchanged in a
single process (as powersgd's and nanochat's helpers do).

A communicator may carry a ``Meter``. Then each collective counts the bytes it moves on this rank
(``traffic.collective_bytes``), and a synchronous one adds its time to an *account* of the meter:
``account="comm"`` (communicating), ``"wait"`` (waiting on peers), or None (neither time nor bytes:
set-up or measurement traffic that is not the algorithm's). An asynchronous one is counted when it
starts; whoever waits for it times the wait (``timed``). ``Comm`` is the run's communicator: every
rank of a ``DistContext``'s world with the run's meter. Algorithms talk to other ranks only through
it, which keeps every torch.distributed call in ``comm/`` and makes them testable in one process.

Ranks given to a communicator's methods (``root``) are ranks within the communicator; results that
list the members (``allgather``) are in the members' order, which is ascending global rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..records import Meter
from ..traffic import collective_bytes
from .handles import Handle
from .p2p import Exchange, exchange, message_group
from .runtime import DistContext

Op = Literal["sum", "mean", "max", "min", "product"]
Account = Literal["comm", "wait"]  # which of the meter's times a collective adds to
Tensors = torch.Tensor | Sequence[torch.Tensor]

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
               "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}


# torch 2.14's names for the flat collectives; an older torch (a GPU node's own: 2.11 on an H200)
# has the same functions as all_gather_into_tensor and reduce_scatter_tensor
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def reduce_op(op: str) -> dist.ReduceOp:
    """The backend's op for ``op``. "mean" is a sum divided afterwards (gloo and MPI have no AVG)."""
    if op not in _REDUCE_OPS:
        raise ValueError(f"op={op!r} is not valid: choose one of {', '.join(_REDUCE_OPS)}")
    return _REDUCE_OPS[op]


# -- tensors as one buffer ---------------------------------------------------------------------------

def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One contiguous buffer holding ``tensors`` back to back (they must share a dtype)."""
    return _flatten_dense_tensors(list(tensors))


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy ``flat`` back into ``tensors`` in place (the inverse of ``flatten``)."""
    for dst, src in zip(tensors, _unflatten_dense_tensors(flat, list(tensors)), strict=True):
        dst.copy_(src)


def unflatten_views(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views into ``flat`` shaped like ``like`` (no copy)."""
    out, offset = [], 0
    for t in like:
        out.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return out


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


def _nothing() -> None:
    pass


def shard_bounds(numel: int, size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of ``rank``'s shard when ``numel`` elements are padded to a multiple of ``size``
    and cut into ``size`` equal shards (what ``reduce_scatter`` does to a list); stop may pass numel."""
    per = -(-numel // size)
    return rank * per, (rank + 1) * per


def _check_out(out: torch.Tensor, like: torch.Tensor, numel: int, what: str) -> None:
    if out.numel() != numel or out.dtype != like.dtype or not out.is_contiguous():
        raise ValueError(f"out for {what} must be a contiguous {like.dtype} tensor of {numel} "
                         f"elements; got {out.dtype}, {out.numel()} elements")


# -- communicators ------------------------------------------------------------------------------------

class Communicator:
    """A group of ranks seen from one of them, optionally metered. ``rank`` is None on ranks outside
    the group."""

    def __init__(self, ranks: Sequence[int], group: dist.ProcessGroup | None, my_rank: int,
                 meter: Meter | None = None) -> None:
        self.ranks = tuple(sorted(ranks))  # torch numbers group members by ascending global rank
        self.group = group  # None: the default (world) group, or no process group at all
        self.size = len(self.ranks)
        self.rank = self.ranks.index(my_rank) if my_rank in self.ranks else None
        self.meter = meter  # None: nothing is timed or counted

    @classmethod
    def world(cls, meter: Meter | None = None) -> Communicator:
        """Every rank of the job (a world of one when no process group was created)."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls((0,), None, 0, meter)
        return cls(range(dist.get_world_size()), None, dist.get_rank(), meter)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ranks={self.ranks}, rank={self.rank})"

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

    # -- the meter ----------------------------------------------------------------------------------

    def timed(self, account: Account | None = "comm",
              label: str | None = None) -> AbstractContextManager[None]:
        """A block whose time goes to ``account`` (no meter, or account None: nowhere); ``label``
        names it in a trace."""
        if self.meter is None or account is None:
            return nullcontext()
        return self.meter.timed(account, label)

    def count(self, sent: int = 0, received: int = 0) -> None:
        """Count bytes moved outside this communicator's collectives (e.g. by a thread's messages)."""
        if self.meter is not None:
            self.meter.count(sent, received)

    def with_meter(self, meter: Meter | None) -> Communicator:
        """The same group on another meter: a second role's end of the messages (a colocated
        server thread's), which must not count into the training thread's steps."""
        return Communicator(self.ranks, self.group, self.ranks[self.rank], meter)

    # -- point to point: peers are global ranks, on a communicator of every rank ----------------

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> dist.Work:
        """Start sending ``tensor`` (a CUDA one staged through host memory) to ``dst``; the work
        keeps the buffer alive: ``wait`` for it. Messages to one peer with one tag arrive in the
        order they were posted."""
        host = tensor if tensor.device.type == "cpu" else tensor.cpu()
        self.count(sent=nbytes(host))
        return dist.isend(host, dst=dst, tag=tag, group=self.group)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> dist.Work:
        """Post a receive into the host tensor ``tensor`` now (so the sender need not wait for
        us); ``wait`` for it later."""
        self.count(received=nbytes(tensor))
        return dist.irecv(tensor, src=src, tag=tag, group=self.group)

    def wait(self, works: Sequence[Any], account: Account = "wait") -> None:
        with self.timed(account, "messages"):
            for w in works:
                w.wait()

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int,
             account: Account = "comm") -> None:
        """Send ``tensors`` to ``dst`` in order and wait until they are received."""
        self.wait([self.isend(t, dst, tag) for t in tensors], account)

    def recv(self, tensor: torch.Tensor, src: int, tag: int, account: Account = "comm") -> None:
        self.wait([self.irecv(tensor, src, tag)], account)

    def recv_any(self, tensor: torch.Tensor, tag: int, account: Account = "wait") -> int:
        """Receive the next message with ``tag`` from whichever rank sends first; its rank."""
        with self.timed(account, "receive (any rank)"):
            source = dist.recv(tensor, src=None, tag=tag, group=self.group)
        self.count(received=nbytes(tensor))
        return int(source)

    def exchange(self, message: torch.Tensor, to: Sequence[int], receive_from: Sequence[int],
                 tag: int, account: Account = "comm") -> Exchange:
        """Gossip: send ``message`` to every rank in ``to``, receive one like it from each rank in
        ``receive_from`` (``p2p.exchange``); ``complete`` it now or later. Counted as one message
        per peer (no collective's share). A no-op in a world of one."""
        if not self.active:
            return Exchange([], [], [])
        with self.timed(account, "gossip: post"):
            posted = exchange(message, to, receive_from, tag, self.group)
        n = nbytes(message)
        self.count(sent=n * len(to), received=n * len(receive_from))
        return posted

    def complete(self, posted: Exchange, account: Account = "wait") -> list[torch.Tensor]:
        """Wait for ``posted``; the time counts in ``account`` (waiting on peers, by default)."""
        with self.timed(account, "gossip: exchange"):
            return posted.wait()

    # -- collectives ----------------------------------------------------------------------------

    def allreduce(self, x: Tensors, op: Op = "sum", async_op: bool = False,
                  account: Account | None = "comm") -> Any:
        """Reduce ``x`` over the members, leaving the result in ``x`` on every member; returns ``x``."""
        red = reduce_op(op)
        if not self._begin(x, op):
            return self._done(x, async_op)
        if not isinstance(x, torch.Tensor) and self.gathers_lists:
            tensors = check_tensors(x)
            opts = dist.AllreduceCoalescedOptions()
            opts.reduceOp = dist.ReduceOp.AVG if op == "mean" else red

            def coalesced(async_: bool) -> dist.Work:
                opts.asyncOp = async_
                work = self._process_group().allreduce_coalesced(tensors, opts)
                if not async_:
                    work.wait()
                return work

            return self._issue("allreduce", coalesced, _nothing, x, async_op, account,
                               sum(nbytes(t) for t in tensors))
        buf, write_back = pack(x)
        return self._issue(
            "allreduce", lambda a: dist.all_reduce(buf, op=red, group=self.group, async_op=a),
            self._finisher(buf, write_back, op), x, async_op, account, nbytes(buf))

    @property
    def gathers_lists(self) -> bool:
        """Whether the backend reduces a list of tensors where they lie, with no flat copy first
        (the ``mpi`` backend of ``comm.mpi`` gathers them into its shared memory itself);
        elsewhere a list is packed into one buffer and copied back."""
        return self.active and getattr(self._process_group(), "gathers_lists", False)

    def _process_group(self) -> dist.ProcessGroup:
        return self.group if self.group is not None else dist.distributed_c10d._get_default_group()

    def broadcast(self, x: Tensors, root: int = 0, async_op: bool = False,
                  account: Account | None = "comm") -> Any:
        """Copy ``x`` from member ``root`` into ``x`` on every member; returns ``x``."""
        src = self.global_rank(root)
        if not self._begin(x):
            return self._done(x, async_op)
        buf, write_back = pack(x)
        if self.rank == root:
            write_back = _nothing
        return self._issue(
            "broadcast", lambda a: dist.broadcast(buf, src=src, group=self.group, async_op=a),
            write_back, x, async_op, account, nbytes(buf), root)

    def reduce(self, x: Tensors, root: int = 0, op: Op = "sum", async_op: bool = False,
               account: Account | None = "comm", scratch: bool = False) -> Any:
        """Reduce ``x`` into member ``root``'s ``x``; the other members' ``x`` is left as it was,
        unless ``scratch`` says it is a temporary the backend may use (no private copy is made)."""
        dst, red = self.global_rank(root), reduce_op(op)
        if not self._begin(x, op):
            return self._done(x, async_op)
        # Backends may scribble on a non-root's buffer: give them a private one.
        buf, write_back = pack(x, copy=self.rank != root and not scratch)
        if self.rank != root:
            write_back, op = _nothing, "sum"
        return self._issue(
            "reduce", lambda a: dist.reduce(buf, dst=dst, op=red, group=self.group, async_op=a),
            self._finisher(buf, write_back, op), x, async_op, account, nbytes(buf), root)

    def allgather(self, x: Tensors, async_op: bool = False, account: Account | None = "comm",
                  out: torch.Tensor | None = None) -> Any:
        """Every member's ``x`` (same shapes on all), as a list in member order. For a tensor each
        entry is a tensor shaped like it; for a list each entry is a list shaped like it.

        ``out`` (for a tensor ``x``): a contiguous tensor of size x numel elements, e.g. shaped
        ``(size, *x.shape)``, to gather into without allocating; the result is then ``out``, member
        i's ``x`` in its i-th block (as torch's ``all_gather_into_tensor``)."""
        if out is not None:
            if not isinstance(x, torch.Tensor):
                raise TypeError("allgather(out=...) takes a tensor, not a list")
            _check_out(out, x, self.size * x.numel(), "allgather")
        if not self._begin(x):
            if out is None:
                return self._done([x if isinstance(x, torch.Tensor) else list(x)], async_op)
            out.copy_(x.reshape(out.shape))  # a group of one: the copy is the whole collective
            return self._done(out, async_op)
        buf, _ = pack(x)
        if out is not None:
            result: Any = out
        else:
            out = buf.new_empty(self.size * buf.numel())
            if isinstance(x, torch.Tensor):
                result = list(out.view(self.size, *x.shape).unbind(0))
            else:
                tensors = list(x)
                result = [unflatten_views(part, tensors) for part in out.chunk(self.size)]
        flat_in = buf if buf.dim() == 1 else buf.reshape(-1)
        flat_out = out if out.dim() == 1 else out.view(-1)
        return self._issue(
            "allgather",
            lambda a: _all_gather_single(flat_out, flat_in, group=self.group, async_op=a),
            None, result, async_op, account, nbytes(out))

    def reduce_scatter(self, x: Tensors, op: Op = "sum", async_op: bool = False,
                       account: Account | None = "comm", out: torch.Tensor | None = None) -> Any:
        """Reduce ``x`` over the members and give each member its part of the result.

        For a tensor, dim 0 must divide by the group size and member i gets chunk i along dim 0. For
        a list, the tensors are flattened, zero-padded to a multiple of the group size, and member i
        gets the 1-D shard ``shard_bounds(total numel, size, i)`` of the reduced buffer. ``out``: a
        tensor to receive this member's part (allocated when not given).
        """
        red = reduce_op(op)
        if isinstance(x, torch.Tensor) and (x.dim() == 0 or x.shape[0] % self.size):
            raise ValueError(f"reduce_scatter of a tensor needs dim 0 divisible by the group size "
                             f"{self.size}; got shape {tuple(x.shape)} (pass a list to have it "
                             "flattened and padded)")
        if not self._begin(x, op):
            whole = x if isinstance(x, torch.Tensor) else flatten(list(x))
            if out is None:
                return self._done(whole, async_op)
            out.copy_(whole.reshape(out.shape))
            return self._done(out, async_op)
        if isinstance(x, torch.Tensor):
            buf = x.contiguous()
        else:
            flat, _ = pack(x)
            start, stop = shard_bounds(flat.numel(), self.size, 0)
            buf = flat.new_zeros((stop - start) * self.size)
            buf[:flat.numel()] = flat
        if out is None:
            out = buf.new_empty((buf.shape[0] // self.size, *buf.shape[1:]))
        else:
            _check_out(out, buf, buf.numel() // self.size, "reduce_scatter")
        return self._issue(
            "reduce_scatter",
            lambda a: _reduce_scatter_single(out, buf, op=red, group=self.group, async_op=a),
            self._finisher(out, _nothing, op), out, async_op, account, nbytes(buf))

    def alltoall(self, x: torch.Tensor, async_op: bool = False, account: Account | None = "comm",
                 out: torch.Tensor | None = None) -> Any:
        """Cut ``x`` into size equal chunks along dim 0 and send chunk j to member j; returns a
        tensor shaped like ``x`` (``out`` when given) whose chunk i came from member i."""
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] % self.size:
            raise ValueError(f"alltoall needs a tensor whose dim 0 divides by the group size "
                             f"{self.size}")
        if not self._begin(x):
            if out is None:
                return self._done(x, async_op)
            out.copy_(x)
            return self._done(out, async_op)
        buf = x.contiguous()
        if out is None:
            out = torch.empty_like(buf)
        else:
            _check_out(out, buf, buf.numel(), "alltoall")
        return self._issue(
            "alltoall", lambda a: dist.all_to_all_single(out, buf, group=self.group, async_op=a),
            None, out, async_op, account, nbytes(buf))

    # -- objects and synchronization ----------------------------------------------------------------

    def allgather_object(self, obj: Any) -> list[Any]:
        """Every member's picklable ``obj``, in member order. Not metered."""
        if not self._begin(None):
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def gather_object(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Every member's picklable ``obj`` on member ``root`` (a list in member order), None on
        the others. Not metered."""
        dst = self.global_rank(root)
        if not self._begin(None):
            return [obj]
        out: list[Any] | None = [None] * self.size if self.rank == root else None
        dist.gather_object(obj, out, dst=dst, group=self.group)
        return out

    def barrier(self) -> None:
        if self._begin(None):
            dist.barrier(group=self.group)

    # -- plumbing -----------------------------------------------------------------------------------

    def _begin(self, x: Tensors | None, op: str = "sum") -> bool:
        """Check the call; False when there is nothing to communicate (a group of one)."""
        if self.rank is None:
            raise RuntimeError(f"this rank is not a member of {self!r}; only its members may call "
                               "its collectives")
        if x is not None:
            first = x if isinstance(x, torch.Tensor) else check_tensors(x)[0]
            if op == "mean" and not first.is_floating_point():
                raise TypeError(f"op='mean' needs floating-point tensors, got {first.dtype}")
        return self.size > 1

    @staticmethod
    def _done(result: Any, async_op: bool) -> Any:
        return Handle.completed(result) if async_op else result

    def _finisher(self, buf: torch.Tensor, write_back: Callable[[], None],
                  op: str) -> Callable[[], None]:
        """What completes a reduction: a "mean" divides the sum, then the buffer goes back."""
        if op != "mean":
            return write_back
        size = self.size

        def finish() -> None:
            buf.div_(size)
            write_back()

        return finish

    def _issue(self, name: str, call: Callable[[bool], Any], finish: Callable[[], None] | None,
               result: Any, async_op: bool, account: Account | None, moved: int,
               root: int = 0) -> Any:
        """Run ``call(async_op)``, a torch.distributed collective, and meter it: its bytes (on a
        buffer of ``moved`` bytes) always, its time when it is synchronous. A synchronous call runs
        synchronously, so a backend that queues asynchronous work (``comm.mpi``) is not asked to."""
        metered = self.meter is not None and account is not None
        if async_op:
            work = call(True)
            if metered:
                self.meter.count(*collective_bytes(name, moved, self.size, self.rank, root))
            return Handle([work], finish, result)
        if metered:
            with self.meter.timed(account, name):
                call(False)
            self.meter.count(*collective_bytes(name, moved, self.size, self.rank, root))
        else:
            call(False)
        if finish is not None:
            finish()
        return result


class Comm(Communicator):
    """The run's communicator: every rank of ``ctx``'s world, metered by the run's ``meter`` (a
    fresh one if not given). What algorithms talk through. A context of one rank has no process
    group, even inside a multi-rank job (a reference run on one rank): every collective is a no-op."""

    def __init__(self, ctx: DistContext, meter: Meter | None = None) -> None:
        super().__init__(range(ctx.world_size), None, ctx.rank, meter or Meter(ctx.device))
        self.ctx = ctx

    def messages(self, meter: Meter | None = None) -> Communicator:
        """Every rank, on the group messages travel on (``p2p.message_group``: one that can
        receive from any rank), metered by ``meter`` (default: this one's). Collective: every
        rank calls it, in the same order, before any message."""
        return Communicator(self.ranks, message_group(self.ctx), self.ctx.rank,
                            self.meter if meter is None else meter)


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


def alltoall(x: torch.Tensor, async_op: bool = False, group: Communicator | None = None) -> Any:
    return (group or world()).alltoall(x, async_op=async_op)
