"""Point-to-point messages, metered: what an asynchronous parameter server is built from.

A message is a fixed-layout int64 header, optionally followed by a payload whose size both ends
know from the shard layout, so no size is negotiated at run time (only a checkpoint snapshot, whose
size depends on the optimizer's state, sends its byte count in the header first).

Gloo's point-to-point sends are rendezvous (a send completes once the receiver has posted the
matching receive) and its receives can only be waited on, not polled. So a server blocks in
``recv_any`` (no CPU spent while idle), and a client posts the receives for a reply before sending
the request, so that a server never waits on a busy client. The messages go over a gloo group even
when the default group is NCCL (CUDA tensors are staged through host memory).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..records import Meter
from .collectives import Bucket, nbytes
from .runtime import DistContext

HEADER = 4  # int64 slots in every header


def header(*values: int) -> torch.Tensor:
    out = torch.zeros(HEADER, dtype=torch.int64)
    out[:len(values)] = torch.tensor(values, dtype=torch.int64)
    return out


def gloo_group(ctx: DistContext):
    """The group messages travel on: the default one when it is gloo, else a new gloo group.
    Collective: every rank must call it, in the same order."""
    if ctx.world_size == 1 or ctx.backend == "gloo":
        return None
    return dist.new_group(backend="gloo")


class Link:
    """One role's (a worker's or a server's) end of the messages, with its own meter.

    A colocated rank runs a server loop in a thread beside its worker; each role then has its own
    Link and Meter, and the two use disjoint tags and peers, so their messages never match each
    other's receives (gloo's pairs serialize concurrent operations)."""

    def __init__(self, ctx: DistContext, meter: Meter, group=None) -> None:
        self.ctx, self.meter, self.group = ctx, meter, group

    def _host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.device.type == "cpu" else tensor.cpu()

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int,
             bucket: Bucket = "comm") -> None:
        """Send ``tensors`` to ``dst`` in order (a header, then its payload) and wait for them."""
        host = [self._host(t) for t in tensors]
        with self.meter.timed(bucket):
            works = [dist.isend(t, dst=dst, tag=tag, group=self.group) for t in host]
            for w in works:
                w.wait()
        self.meter.count(sent=sum(nbytes(t) for t in host))

    def post_recv(self, tensor: torch.Tensor, src: int, tag: int):
        """Post a receive now (so the sender need not wait for us); ``finish`` it later."""
        return dist.irecv(tensor, src=src, tag=tag, group=self.group)

    def finish(self, posted: Sequence, tensors: Sequence[torch.Tensor],
               bucket: Bucket = "wait") -> None:
        """Wait for posted receives into ``tensors`` (host tensors)."""
        with self.meter.timed(bucket):
            for w in posted:
                w.wait()
        self.meter.count(received=sum(nbytes(t) for t in tensors))

    def recv(self, tensor: torch.Tensor, src: int, tag: int, bucket: Bucket = "comm") -> None:
        with self.meter.timed(bucket):
            dist.recv(tensor, src=src, tag=tag, group=self.group)
        self.meter.count(received=nbytes(tensor))

    def recv_any(self, tensor: torch.Tensor, tag: int, bucket: Bucket = "wait") -> int:
        """Receive the next message with ``tag`` from whichever rank sends first; its rank."""
        with self.meter.timed(bucket):
            source = dist.recv(tensor, src=None, tag=tag, group=self.group)
        self.meter.count(received=nbytes(tensor))
        return int(source)
