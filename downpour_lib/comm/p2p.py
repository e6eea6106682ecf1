"""Point-to-point messages, metered: what an asynchronous parameter server is built from.

A message is a fixed-layout int64 header, optionally followed by a payload whose size both ends
know from the shard layout, so no size is negotiated at run time (only a checkpoint snapshot, whose
size depends on the optimizer's state, sends its byte count in the header first).

Gloo's point-to-point sends are rendezvous (a send completes once the receiver has posted the
matching receive) and its receives can only be waited on, not polled. So a server blocks in
``recv_any`` (no CPU spent while idle), and a client posts the receives for a reply before sending
the request, so that a server never waits on a busy client. The messages go over a gloo group even
when the default group is NCCL (CUDA tensors are staged through host memory), and over an MPI
communicator of their own when the default group is ``mpi``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..records import Meter
from .collectives import Account, nbytes
from .runtime import DistContext, new_group

HEADER = 4  # int64 slots in every header


def header(*values: int) -> torch.Tensor:
    out = torch.zeros(HEADER, dtype=torch.int64)
    out[:len(values)] = torch.tensor(values, dtype=torch.int64)
    return out


def message_group(ctx: DistContext):
    """The group messages travel on: the default one when it is gloo; under the ``mpi`` backend a
    communicator of their own (torch cannot add a gloo group to an MPI default group, which has no
    store); under NCCL a gloo group (NCCL has no receive from any source).
    Collective: every rank must call it, in the same order."""
    if ctx.world_size == 1 or ctx.backend == "gloo":
        return None
    if ctx.backend == "mpi":
        return new_group(backend="mpi")
    return new_group(backend="gloo")


class Link:
    """One role's (a worker's or a server's) end of the messages, with its own meter.

    A colocated rank runs a server loop in a thread beside its worker; each role then has its own
    Link and Meter, and the two use disjoint tags and peers, so their messages never match each
    other's receives (gloo's pairs serialize concurrent operations)."""

    def __init__(self, ctx: DistContext, meter: Meter, group=None) -> None:
        self.ctx, self.meter, self.group = ctx, meter, group

    def _host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.device.type == "cpu" else tensor.cpu()

    def post_send(self, tensor: torch.Tensor, dst: int, tag: int):
        """Start sending ``tensor`` to ``dst`` (the work keeps the buffer alive); ``wait`` for it.
        Messages to one peer with one tag arrive in the order they were posted."""
        host = self._host(tensor)
        self.meter.count(sent=nbytes(host))
        return dist.isend(host, dst=dst, tag=tag, group=self.group)

    def post_recv(self, tensor: torch.Tensor, src: int, tag: int):
        """Post a receive into the host tensor ``tensor`` now (so the sender need not wait for
        us); ``wait`` for it later."""
        self.meter.count(received=nbytes(tensor))
        return dist.irecv(tensor, src=src, tag=tag, group=self.group)

    def wait(self, works: Sequence, account: Account = "wait") -> None:
        with self.meter.timed(account, "messages"):
            for w in works:
                w.wait()

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int,
             account: Account = "comm") -> None:
        """Send ``tensors`` to ``dst`` in order and wait until they are received."""
        self.wait([self.post_send(t, dst, tag) for t in tensors], account)

    def recv(self, tensor: torch.Tensor, src: int, tag: int, account: Account = "comm") -> None:
        self.wait([self.post_recv(tensor, src, tag)], account)

    def recv_any(self, tensor: torch.Tensor, tag: int, account: Account = "wait") -> int:
        """Receive the next message with ``tag`` from whichever rank sends first; its rank."""
        with self.meter.timed(account, "receive (any rank)"):
            source = dist.recv(tensor, src=None, tag=tag, group=self.group)
        self.meter.count(received=nbytes(tensor))
        return int(source)
