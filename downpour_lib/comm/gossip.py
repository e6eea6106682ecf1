"""Point-to-point gossip messages: post now, complete now or later; no-ops without peers.

The gossip algorithms (``algorithms/sgp``, ``osgp``, ``dpsgd``, ``adpsgd``) send one flat buffer to
each out-peer and receive one from each in-peer per step. ``post`` issues the receives and sends as
one ``batch_isend_irecv`` batch, so no ordering of sends and receives can deadlock on a directed
graph (gloo runs them as independent non-blocking operations; NCCL coalesces them). The returned
``Exchange`` can be completed at once (SGP, D-PSGD) or left in flight across the next forward and
backward pass (Overlap-SGP). A tag per step keeps messages of different steps apart when several
are in flight between the same pair.

``Gossip`` meters what it does into the step's ``Meter`` (logical bytes: one message per out-peer
sent, one per in-peer received); ``exchange`` on a dedicated group (``new_group``) is for a
communication thread, which must not touch the training thread's meter nor share its group: gloo
does not allow two threads to drive the same process group at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from . import runtime
from .collectives import Account, Comm, nbytes

#: Tags stay below 2**30 (gloo builds its slot from the tag).
TAG_MODULUS = 1 << 30


class Exchange:
    """Messages posted together; ``received`` is valid once ``wait()`` returned."""

    def __init__(self, works: list, sent: list[torch.Tensor], received: list[torch.Tensor]) -> None:
        self._works = works
        self.sent = sent  # kept alive (and unmodified) until the sends complete
        self.received = received

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def wait(self) -> list[torch.Tensor]:
        for work in self._works:
            work.wait()
        self._works = []
        self.sent = []
        return self.received


def exchange(message: torch.Tensor, to: Sequence[int], receive_from: Sequence[int], tag: int,
             group: dist.ProcessGroup | None = None) -> Exchange:
    """Send ``message`` to every rank in ``to``; receive a buffer like it from each rank in
    ``receive_from``. Non-blocking: complete with ``Exchange.wait()``. Unmetered."""
    received = [torch.empty_like(message) for _ in receive_from]
    if not to and not receive_from:
        return Exchange([], [], received)
    tag %= TAG_MODULUS
    ops = [dist.P2POp(dist.irecv, buf, src, group=group, tag=tag)
           for buf, src in zip(received, receive_from, strict=True)]
    ops += [dist.P2POp(dist.isend, message, dst, group=group, tag=tag) for dst in to]
    if dist.get_backend(group) == "nccl":  # NCCL needs the batch to coalesce its sends and receives
        return Exchange(dist.batch_isend_irecv(ops), [message], received)
    # gloo and the mpi backend run each as an independent non-blocking operation (receives posted
    # first), which cannot deadlock; the Python mpi backend has no batch (coalescing) support
    return Exchange([op.op(op.tensor, op.peer, group=op.group, tag=op.tag) for op in ops],
                    [message], received)


class Gossip:
    """Metered gossip on the default group, seen from one rank."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def post(self, message: torch.Tensor, to: Sequence[int], receive_from: Sequence[int], tag: int,
             account: Account = "comm") -> Exchange:
        if not self.comm.active:
            return Exchange([], [], [])
        with self.comm.timed(account, "gossip: post"):
            posted = exchange(message, to, receive_from, tag)
        n = nbytes(message)  # point to point: one message per peer, no collective's share
        self.comm.count(sent=n * len(to), received=n * len(receive_from))
        return posted

    def complete(self, posted: Exchange, account: Account = "wait") -> list[torch.Tensor]:
        """Wait for ``posted``; the time counts in ``account`` (waiting on peers, by default)."""
        with self.comm.timed(account, "gossip: exchange"):
            return posted.wait()


def new_group(comm: Comm) -> dist.ProcessGroup | None:
    """A process group of every rank for a communication thread (collective: every rank calls it,
    in the same order). None in a world of one."""
    if not comm.active:
        return None
    group = runtime.new_group(ranks=list(range(comm.size)))
    dist.barrier(group=group)  # its first use involves every rank, as batch_isend_irecv requires
    return group


def destroy_group(group: dist.ProcessGroup | None) -> None:
    """Collective: every rank is past its last message on ``group`` before any rank closes it
    (a gloo pair closed early would fail a peer's pending receive)."""
    if group is not None and dist.is_initialized():
        dist.barrier(group=group)
        dist.destroy_process_group(group)


def consensus_distance(comm: Comm, flat: torch.Tensor) -> float:
    """Mean over ranks of ||x_i - x_bar||, x_bar the ranks' average of ``flat``. Collective, and
    unmetered: it measures the algorithm, it is not part of its traffic. 0.0 in a world of one."""
    if not comm.active:
        return 0.0
    x = flat.detach().to(torch.float64)
    mean = x.clone()
    comm.allreduce(mean, account=None)
    mean /= comm.size
    distance = torch.linalg.vector_norm(x - mean).reshape(1)
    comm.allreduce(distance, account=None)
    return float(distance) / comm.size
