"""Collectives that time themselves and count their bytes, and do nothing in a world of one.

Algorithms talk to other ranks only through a ``Comm``: it keeps every torch.distributed call in
``comm/`` and makes the algorithms testable in one process (as powersgd's and nanochat's helpers do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..records import Meter
from .runtime import DistContext

Bucket = Literal["comm", "wait"]


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One contiguous buffer holding ``tensors`` back to back (they must share a dtype)."""
    return _flatten_dense_tensors(list(tensors))


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy ``flat`` back into ``tensors`` in place (the inverse of ``flatten``)."""
    for dst, src in zip(tensors, _unflatten_dense_tensors(flat, list(tensors)), strict=True):
        dst.copy_(src)


class Comm:
    """The default group, seen from one rank, with a meter attached."""

    def __init__(self, ctx: DistContext, meter: Meter | None = None) -> None:
        self.ctx = ctx
        self.meter = meter or Meter(ctx.device)
        self.rank, self.size = ctx.rank, ctx.world_size

    @property
    def active(self) -> bool:
        return self.size > 1

    def reduce(self, tensor: torch.Tensor, dst: int, bucket: Bucket = "comm") -> None:
        """Sum ``tensor`` into rank ``dst``. Logical bytes: everyone else sends it to ``dst``."""
        if not self.active:
            return
        with self.meter.timed(bucket):
            dist.reduce(tensor, dst=dst, op=dist.ReduceOp.SUM)
        n = nbytes(tensor)
        if self.rank == dst:
            self.meter.count(received=n * (self.size - 1))
        else:
            self.meter.count(sent=n)

    def broadcast(self, tensor: torch.Tensor, src: int, bucket: Bucket = "comm") -> None:
        """Copy ``tensor`` from rank ``src`` to everyone. Logical bytes: ``src`` sends it to each."""
        if not self.active:
            return
        with self.meter.timed(bucket):
            dist.broadcast(tensor, src=src)
        n = nbytes(tensor)
        if self.rank == src:
            self.meter.count(sent=n * (self.size - 1))
        else:
            self.meter.count(received=n)

    def all_reduce(self, tensor: torch.Tensor, bucket: Bucket = "comm") -> None:
        """Sum in place on every rank. Logical bytes: a ring's 2(N-1)/N of the buffer each way."""
        if not self.active:
            return
        with self.meter.timed(bucket):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        moved = 2 * (self.size - 1) * nbytes(tensor) // self.size
        self.meter.count(sent=moved, received=moved)

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def gather_objects(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Every rank's ``obj`` on ``dst`` (a list by rank), None elsewhere. Not metered."""
        if not self.active:
            return [obj]
        out: list[Any] | None = [None] * self.size if self.rank == dst else None
        dist.gather_object(obj, out, dst=dst)
        return out
