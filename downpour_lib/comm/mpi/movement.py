"""``MPIProcessGroup``'s data movement: broadcast, allgather, gather, scatter and all-to-all.

A mixin of the group (``process_group``), whose state and machinery it uses: ``_issue``, its
``Router`` and the routes it keeps (``routing``), the shared memory (``_shm``) and MPI's data phase
(``_data``). Broadcast and allgather on one node take shared memory or Open MPI's calls, whichever
the group timed fastest for the size (``tuning``); the others are MPI's v-variants on flat buffers
(``lists``).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist

from . import lists, profiling
from .liveness import PeerTimeout
from .routing import Route
from .types import Operand, check_dtype, scratch, spec, vspec
from .work import EXECUTOR


def asynchronous(opts) -> bool:
    """Whether a call with ``opts`` is asynchronous (torch's default where it passes none)."""
    return True if opts is None else opts.asyncOp


class DataMovement:
    """Broadcast, allgather, gather, scatter and all-to-all of ``MPIProcessGroup``."""

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        if not opts.asyncOp and len(tensors) == 1:  # the short path, once a call of its kind took it
            t = tensors[0]
            route = self._routes.get(("broadcast", t.nbytes, t.dtype, opts.rootRank, True))
            # the short path's checks (``routing.Route``), inlined
            if route is not None and route.short and t.is_cpu and t.is_contiguous() and self._open \
                    and EXECUTOR.idle() and not profiling.active():
                try:
                    if route.c_call is not None:
                        self._data.collective(*route.c_call, 0, t.data_ptr())
                    else:
                        self._shm.broadcast(t, opts.rootRank)
                except PeerTimeout as exc:
                    raise self.explain(exc) from None
                return None  # done: no work to wait for
        t = lists.one(tensors, "broadcast")
        root = opts.rootRank
        if t.is_cpu and t.is_contiguous():  # the common case, kept short: MPI works on t itself
            return self._issue("broadcast", partial(self._broadcast, t, root), tensors,
                               opts.asyncOp, inputs=tensors)
        x = Operand(t, self._r != root, self._direct())

        def run() -> None:
            self._broadcast(x.local, root)
            x.finish()

        return self._issue("broadcast", run, tensors, opts.asyncOp, inputs=tensors)

    def _broadcast(self, local: torch.Tensor, root: int) -> None:
        self._broadcast_by(self._router.broadcast(local, root), local, root)

    def _broadcast_by(self, route: Route, local: torch.Tensor, root: int) -> None:
        if route.path == "shm":
            self._shm.broadcast(local, root)
        elif route.c_call is not None:
            self._data.collective(*route.c_call, 0, local.data_ptr())
        else:
            self._data("Bcast", spec(local), root, blocking=route.path == "mpi")

    def allgather(self, output_tensors, input_tensors, opts=None):
        t = lists.one(input_tensors, "all_gather")
        outputs = output_tensors[0] if len(output_tensors) == 1 else []
        counts = lists.same(outputs, t, self._n, "all_gather")
        if counts[self._r] != t.numel():
            raise ValueError(f"mpi backend: all_gather input has {t.numel()} elements, but this "
                             f"rank's output slot has {counts[self._r]}")
        direct = self._direct()
        x, tiled = Operand(t, False, direct), lists.tiled(outputs, sum(counts), direct)
        flat = scratch(sum(counts), t, direct) if tiled is None else tiled
        if tiled is not None and lists.overlaps(x.local, tiled):  # e.g. the input is this rank's output
            x = Operand(x.local.clone(), False, direct)

        def run() -> None:
            if len(set(counts)) == 1:
                self._allgather_by(self._router.allgather(x.local, flat), x.local, flat)
            else:
                self._data("Allgatherv", x.spec(), vspec(flat, counts))
            if tiled is None:
                lists.split_into(flat, counts, outputs)

        return self._issue("all_gather", run, output_tensors, asynchronous(opts),
                           inputs=input_tensors)

    def all_gather_single(self, output, input, opts=None):
        if opts is not None and not opts.asyncOp:  # the short path, once a call of its kind took it
            route = self._routes.get(("allgather", output.nbytes, output.dtype, input.nbytes, True))
            # the short path's checks (``routing.Route``), inlined; the buffers must not overlap
            if route is not None and route.short and input.dtype is output.dtype and input.is_cpu \
                    and output.is_cpu and input.is_contiguous() and output.is_contiguous() \
                    and self._open and EXECUTOR.idle() and not profiling.active():
                send, recv = input.data_ptr(), output.data_ptr()
                if not lists.spans_overlap(send, input.nbytes, recv, output.nbytes):
                    try:
                        if route.c_call is not None:
                            self._data.collective(*route.c_call, send, recv)
                        else:
                            self._shm.allgather(input, output)
                    except PeerTimeout as exc:
                        raise self.explain(exc) from None
                    return None  # done: no work to wait for
        return self._issue("all_gather_into_tensor", self._all_gather_into(output, input), [output],
                           asynchronous(opts), inputs=[input])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        runs = [self._all_gather_into(o, i) for o, i in zip(outputs, inputs, strict=True)]
        return self._issue("all_gather_into_tensor_coalesced", lambda: [r() for r in runs], outputs,
                           asynchronous(opts), inputs=inputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _all_gather_into(self, output: torch.Tensor, input: torch.Tensor):
        check_dtype(input.dtype, "all_gather_into_tensor")
        if input.dtype != output.dtype or output.numel() != self._n * input.numel():
            raise ValueError(f"mpi backend: all_gather_into_tensor needs an output of {self._n} x the "
                             f"input's elements and dtype; got {output.numel()} {output.dtype} for "
                             f"{input.numel()} {input.dtype}")
        direct = self._direct()
        x, y = Operand(input, False, direct), Operand(output, True, direct)
        if lists.overlaps(x.local, y.local):  # e.g. the input is this rank's chunk of the output
            x = Operand(x.local.clone(), False, direct)

        def run() -> None:
            self._allgather_by(self._router.allgather(x.local, y.local), x.local, y.local)
            y.finish()

        return run

    def _allgather_by(self, route: Route, local: torch.Tensor, flat: torch.Tensor) -> None:
        if route.path == "shm":
            self._shm.allgather(local, flat)
        elif route.c_call is not None:
            self._data.collective(*route.c_call, local.data_ptr(), flat.data_ptr())
        else:
            self._data("Allgather", spec(local), spec(flat, local.numel()),
                       blocking=route.path == "mpi")

    def gather(self, output_tensors, input_tensors, opts):
        t = lists.one(input_tensors, "gather")
        root, direct = opts.rootRank, self._direct()
        x = Operand(t, False, direct)
        if self._r != root:
            return self._issue("gather", lambda: self._data("Gatherv", x.spec(), None, root), [],
                               opts.asyncOp, inputs=input_tensors)
        outputs = output_tensors[0] if len(output_tensors) == 1 else []
        counts = lists.same(outputs, t, self._n, "gather")
        flat = scratch(sum(counts), t, direct)

        def run() -> None:
            self._data("Gatherv", x.spec(), vspec(flat, counts), root)
            lists.split_into(flat, counts, outputs)

        return self._issue("gather", run, output_tensors, opts.asyncOp, inputs=input_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        y = lists.one(output_tensors, "scatter")
        root, direct = opts.rootRank, self._direct()
        out = Operand(y, True, direct)
        flat, counts, inputs = None, [], []
        if self._r == root:
            inputs = input_tensors[0] if len(input_tensors) == 1 else []
            counts = lists.same(inputs, y, self._n, "scatter")
            flat = lists.concat(inputs, counts, direct)

        def run() -> None:
            # the closure holds ``flat`` itself: a buffer made from its address would not keep it
            # alive until a queued scatter runs
            self._data("Scatterv", None if flat is None else vspec(flat, counts), out.spec(),
                                      root)
            out.finish()

        return self._issue("scatter", run, output_tensors, opts.asyncOp, inputs=inputs)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        check_dtype(input.dtype, "all_to_all_single")
        if input.dtype != output.dtype:
            raise TypeError(f"mpi backend: all_to_all_single mixes {input.dtype} and {output.dtype}")
        send_counts = lists.counts(input, list(input_split_sizes), self._n, "all_to_all_single input")
        recv_counts = lists.counts(output, list(output_split_sizes), self._n, "all_to_all_single output")
        direct = self._direct()
        x, y = Operand(input, False, direct), Operand(output, True, direct)
        if lists.overlaps(x.local, y.local):
            x = Operand(x.local.clone(), False, direct)

        def run() -> None:
            self._data("Alltoallv", vspec(x.local, send_counts), vspec(y.local, recv_counts))
            y.finish()

        return self._issue("all_to_all_single", run, [output], asynchronous(opts), inputs=[input])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        if not input_tensors:
            raise ValueError("mpi backend: all_to_all needs one input tensor per rank")
        send_counts = lists.same(input_tensors, input_tensors[0], self._n, "all_to_all input")
        recv_counts = lists.same(output_tensors, input_tensors[0], self._n, "all_to_all output")
        direct = self._direct()
        flat_in = lists.concat(input_tensors, send_counts, direct)
        flat_out = scratch(sum(recv_counts), input_tensors[0], direct)

        def run() -> None:
            self._data("Alltoallv", vspec(flat_in, send_counts), vspec(flat_out, recv_counts))
            lists.split_into(flat_out, recv_counts, output_tensors)

        return self._issue("all_to_all", run, output_tensors, asynchronous(opts), inputs=input_tensors)
