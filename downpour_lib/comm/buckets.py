"""Gradient buckets whose allreduce overlaps the backward pass: the communication side of
``algorithms.allreduce``.

This is Horovod's tensor fusion (Sergeev & Del Balso 2018, "Horovod: fast and easy distributed deep
learning in TensorFlow") with the scheduling of PyTorch DDP's reducer (Li et al. 2020, "PyTorch
Distributed: Experiences on Accelerating Data Parallel Training"):

- Parameters are packed into buckets of about ``bucket_bytes`` each, in the order backward produces
  their gradients. That order is recorded on the first window and agreed on (rank 0's order is
  broadcast), then the buckets are rebuilt; before that the reverse registration order stands in.
- ``Tensor.register_post_accumulate_grad_hook`` fires as each gradient is ready. The hook scales the
  gradient by 1/(ranks x micro-batches) straight into its slot of the bucket (one pass: copy and
  scale together) and frees ``.grad``. When a bucket is full its allreduce starts asynchronously
  while backward goes on. Buckets start strictly in index order, so every rank issues the same
  collectives in the same order even when ranks see different unused parameters.
- ``after_backward`` starts any bucket still waiting for a gradient that never came (an unused
  parameter counts as zero), waits for all of them (the exposed communication, metered as comm
  time), and points each ``.grad`` at its averaged slot of the bucket: no copy back.
- Each bucket carries one usage flag per parameter, summed with the gradients: a parameter no rank
  used gets ``.grad = None`` (so the optimizer leaves it alone, as in one process), at no extra
  message.
- With ``accumulation_steps = k`` the first k-1 backward passes only add into the buckets; the k-th
  launches them. With ``wire_dtype`` the buckets travel as fp16/bf16 and are widened on arrival.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..records import device_mark
from .collectives import Communicator, nbytes
from .handles import Handle


@dataclass
class Bucket:
    params: list[int]  # indices into GradientBuckets.params, in backward order
    buffer: torch.Tensor  # the gradients back to back, then one usage flag per parameter
    flags: torch.Tensor  # the tail of buffer: 1 where this rank produced the gradient
    wire: torch.Tensor | None  # the compressed copy that travels, if compressing
    pending: int = 0  # parameters whose gradient this window's last backward has not produced yet
    handle: Handle | None = None


class GradientBuckets:
    """Bucketed, overlapped gradient averaging for one model. ``start()`` installs the hooks,
    ``after_backward()`` runs after each backward, ``close()`` removes the hooks."""

    def __init__(self, params: Sequence[tuple[str, nn.Parameter]], comm: Communicator,
                 bucket_bytes: int, wire_dtype: torch.dtype | None = None,
                 accumulation_steps: int = 1) -> None:
        self.names = [name for name, _ in params]
        self.params = [p for _, p in params]
        self.comm = comm  # its meter, if any, counts the buckets' bytes and the exposed wait
        self.bucket_bytes, self.wire_dtype = bucket_bytes, wire_dtype
        self.k = accumulation_steps
        self.scale = 1.0 / (comm.size * accumulation_steps)
        self.hooks: list = []
        self.buckets: list[Bucket] = []

    # -- life cycle ------------------------------------------------------------------------------

    def start(self) -> None:
        n = len(self.params)
        self.filled = [False] * n  # slot holds this window's gradient
        self.fired = [-1] * n  # the backward pass in which the hook last fired
        self.first_order: list[int] = []  # backward order, seen in the first window
        self.first_seen: set[int] = set()
        self.serial = 0  # backward passes so far
        self.micro = 0  # position within the accumulation window
        self.windows = 0
        # Before the first backward, reverse registration order is the usual guess (DDP's too).
        self._build(list(reversed(range(n))))
        for i, p in enumerate(self.params):
            self.hooks.append(p.register_post_accumulate_grad_hook(self._hook(i)))

    def close(self, finished: bool = True) -> None:
        """Remove the hooks. ``finished``: the run ended normally (else it failed, and
        whatever it left undone is no news)."""
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
        # after_backward waits for every collective it starts, so a handle still here means a
        # backward was cut short by an error: waiting on it could block until the group's timeout
        # while the job is being torn down, so it is dropped.
        for bucket in self.buckets:
            bucket.handle = None
        if self.micro and finished:
            warnings.warn(f"the last {self.micro} micro-batch(es) were never applied: the run ended "
                          f"inside an accumulation window of {self.k}; make the number of steps a "
                          "multiple of accumulation_steps", stacklevel=2)

    def _build(self, order: Sequence[int]) -> None:
        groups: list[list[int]] = []
        size = 0
        for i in order:
            p = self.params[i]
            if not groups or size >= self.bucket_bytes or p.dtype != self.params[groups[-1][0]].dtype:
                groups.append([])
                size = 0
            groups[-1].append(i)
            size += nbytes(p)
        self.order = list(order)
        self.buckets, self.bucket_of, self.views = [], [0] * len(self.params), [None] * len(self.params)
        for b, group in enumerate(groups):
            first = self.params[group[0]]
            numel = sum(self.params[i].numel() for i in group)
            buffer = torch.zeros(numel + len(group), dtype=first.dtype, device=first.device)
            wire = None
            if self.wire_dtype is not None and first.dtype != self.wire_dtype:
                wire = torch.empty(buffer.numel(), dtype=self.wire_dtype, device=first.device)
            offset = 0
            for i in group:
                p = self.params[i]
                self.views[i] = buffer[offset:offset + p.numel()].view_as(p)
                self.bucket_of[i] = b
                offset += p.numel()
            self.buckets.append(Bucket(group, buffer, buffer[numel:], wire, pending=len(group)))
        self.next_launch = self.first_inflight = 0

    # -- during backward -------------------------------------------------------------------------

    def _hook(self, i: int):
        def hook(param: nn.Parameter) -> None:
            self._on_grad(i, param)
        return hook

    @torch.no_grad()
    def _on_grad(self, i: int, param: nn.Parameter) -> None:
        if self.fired[i] == self.serial:
            raise RuntimeError(f"parameter {self.names[i]!r} got a second gradient before "
                               "after_backward(): call it once after every backward")
        self.fired[i] = self.serial
        if self.windows == 0 and i not in self.first_seen:
            self.first_seen.add(i)
            self.first_order.append(i)
        grad, view = param.grad, self.views[i]
        bucket = self.buckets[self.bucket_of[i]]
        if grad.data_ptr() == view.data_ptr():
            view.mul_(self.scale)  # backward added into the slot itself (.grad was not reset)
        elif not self.filled[i]:
            torch.mul(grad, self.scale, out=view)
        else:
            view.add_(grad, alpha=self.scale)
        param.grad = None  # the bucket holds it now; free the memory while backward goes on
        self.filled[i] = True
        if self.micro == self.k - 1:
            bucket.pending -= 1
            if bucket.pending == 0:
                self._launch_ready()
            self._poke()

    def _launch_ready(self) -> None:
        """Start full buckets in index order, so all ranks issue the same sequence."""
        while self.next_launch < len(self.buckets) and self.buckets[self.next_launch].pending == 0:
            self._launch(self.buckets[self.next_launch])
            self.next_launch += 1

    def _launch(self, bucket: Bucket) -> None:
        filled = [self.filled[i] for i in bucket.params]
        if all(filled):
            bucket.flags.fill_(1.0)
        else:
            for i, used in zip(bucket.params, filled, strict=True):
                if not used:  # unused here this window: contributes zero
                    self.views[i].zero_()
            bucket.flags.copy_(torch.tensor(filled, dtype=bucket.flags.dtype))
        send = bucket.buffer
        if bucket.wire is not None:
            bucket.wire.copy_(bucket.buffer)
            send = bucket.wire
        tracer = self.comm.meter.tracer if self.comm.meter is not None else None
        launched = device_mark(send) if tracer is not None else None
        bucket.handle = self.comm.allreduce(send, async_op=True)
        if tracer is not None and bucket.handle._works:  # launch to completion, on its own track
            start, index = time.perf_counter(), self.buckets.index(bucket)
            name, size = f"bucket {index} allreduce", nbytes(send)
            bucket.handle._works[0].get_future().add_done_callback(
                lambda _: tracer.launch(name, start, launched, time.perf_counter(), "buckets",
                                        bytes=size))

    def _poke(self) -> None:
        """Ask the oldest unfinished collective how it is doing: backends that progress only inside
        their own calls (MPI without a progress thread) move on here, between gradients."""
        while (self.first_inflight < self.next_launch
               and self.buckets[self.first_inflight].handle.is_completed()):
            self.first_inflight += 1

    # -- after backward --------------------------------------------------------------------------

    def after_backward(self) -> bool:
        """Call once after every backward. Returns True when this ended an accumulation window:
        the averaged gradients are then in ``.grad`` and the optimizer may step."""
        self.serial += 1
        if self.micro < self.k - 1:
            self.micro += 1
            return False
        with self.comm.timed("comm", "buckets: exposed wait"):  # what backward did not hide
            for bucket in self.buckets:
                bucket.pending = 0
            self._launch_ready()
            for bucket in self.buckets:
                bucket.handle.wait()
        for bucket in self.buckets:
            if bucket.wire is not None:
                bucket.buffer.copy_(bucket.wire)
            used = bucket.flags.tolist()
            for flag, i in zip(used, bucket.params, strict=True):
                self.params[i].grad = self.views[i] if flag > 0 else None
            bucket.handle, bucket.pending = None, len(bucket.params)
        self.filled = [False] * len(self.params)
        self.micro = self.next_launch = self.first_inflight = 0
        self.windows += 1
        if self.windows == 1:
            self._rebuild()
        return True

    def _rebuild(self) -> None:
        """Re-pack the buckets in the order the first window's backward produced gradients (rank
        0's, so every rank agrees); parameters it never saw go last."""
        seen = set(self.first_order)
        order = self.first_order + [i for i in self.order if i not in seen]
        if self.comm.active:
            agreed = torch.tensor(order, dtype=torch.int64, device=self.params[0].device)
            self.comm.broadcast(agreed, root=0, account=None)  # set-up, not the algorithm's traffic
            order = agreed.tolist()
        if order != self.order:
            self._build(order)
