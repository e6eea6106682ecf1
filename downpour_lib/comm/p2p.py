"""Point-to-point messages: what an asynchronous parameter server and gossip are built from. The
metered API is ``Communicator``'s (``isend``, ``irecv``, ``recv_any``, ``exchange``, on its own
meter); this module holds what it is made of, unmetered.

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


#: Tags stay below 2**30 (gloo builds its slot from the tag).
TAG_MODULUS = 1 << 30


class Exchange:
    """Messages posted together; ``received`` is valid once ``wait()`` returned. ``device``: where
    the received buffers go once they arrive, when they were received into host memory."""

    def __init__(self, works: list, sent: list[torch.Tensor], received: list[torch.Tensor],
                 device: torch.device | None = None) -> None:
        self._works = works
        self.sent = sent  # kept alive (and unmodified) until the sends complete
        self.received = received
        self._device = device

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def wait(self) -> list[torch.Tensor]:
        for work in self._works:
            work.wait()
        self._works = []
        self.sent = []
        if self._device is not None:
            self.received = [buf.to(self._device) for buf in self.received]
            self._device = None
        return self.received


def exchange(message: torch.Tensor, to: Sequence[int], receive_from: Sequence[int], tag: int,
             group: dist.ProcessGroup | None = None) -> Exchange:
    """Send ``message`` to every rank in ``to``; receive a buffer like it from each rank in
    ``receive_from``. Non-blocking: complete with ``Exchange.wait()``. Unmetered.

    A CUDA ``message`` on a gloo group travels through host memory: gloo's point-to-point
    reads and writes host pointers only (handed a device pointer, its TCP transport fails in
    ``writev`` with "Bad address" and aborts the process), and the messages' group is gloo under a
    NCCL default group. The received buffers come back to the device in ``wait()``."""
    if not to and not receive_from:
        return Exchange([], [], [])
    backend, device = dist.get_backend(group), None
    if message.device.type == "cuda" and backend == "gloo":
        device, message = message.device, message.cpu()
    received = [torch.empty_like(message) for _ in receive_from]
    tag %= TAG_MODULUS
    ops = [dist.P2POp(dist.irecv, buf, src, group=group, tag=tag)
           for buf, src in zip(received, receive_from, strict=True)]
    ops += [dist.P2POp(dist.isend, message, dst, group=group, tag=tag) for dst in to]
    if backend == "nccl":  # NCCL needs the batch to coalesce its sends and receives
        return Exchange(dist.batch_isend_irecv(ops), [message], received, device)
    # gloo and the mpi backend run each as an independent non-blocking operation (receives posted
    # first), which cannot deadlock; the Python mpi backend has no batch (coalescing) support
    return Exchange([op.op(op.tensor, op.peer, group=op.group, tag=op.tag) for op in ops],
                    [message], received, device)
