"""``MPIProcessGroup``: a torch.distributed process group whose collectives are MPI's, through mpi4py.

A Python subclass of ``torch.distributed.ProcessGroup`` (the extension point torch's own
``test/distributed/test_c10d_pypg.py`` exercises): torch calls these methods for ``dist.all_reduce``
and friends, for DDP's reducer, and for object collectives. Each method checks its arguments on the
calling thread (so errors surface where the user called), builds a closure of blocking MPI calls,
and hands it to ``work.EXECUTOR`` (at once for synchronous calls, queued for ``async_op=True``).
A synchronous allreduce, broadcast or all_gather_into_tensor of contiguous CPU tensors whose kind
already went to C steps (shared memory's, or the C data phase's MPI call) takes a short path
instead (a route's ``short``: ``routing``): the same C steps and guarantees, without the closure, the queue's
checks, the watchdog's table or a work to return, which were most of our Python at 4 KB. Which way
each kind of call goes is the group's ``Router``'s (``routing``). Ranks are group ranks, as torch
passes them. Buffers and dtypes: ``types``. Broadcast, allgather, gather, scatter and all-to-all are
``movement``'s (a mixin of the class).

One communicator per group: the default group duplicates ``MPI_COMM_WORLD`` (so our traffic never
matches the user's); a ``new_group`` is ``MPI_Comm_create_group`` over its members, which only they
call, exactly as torch only calls the backend's creator on members.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
from mpi4py import MPI

from . import lists, monitored, profiling
from .data_phase import SHM_DATA_BYTES, DataPhase
from .liveness import WATCHDOG, CommTimeout, PeerTimeout, explain, gate
from .movement import DataMovement, asynchronous
from .routing import Route, Router
from .shm_data import ShmCollectives
from .types import Operand, check_dtype, kind, reduction, spec
from .work import EXECUTOR, RequestWork, _seconds, done

# profiler event names (``profiling``) where they are not "mpi:" + the operation's name: native
# ProcessGroupMPI's for the operations it has, torch's op names for the others
_EVENTS = {"allreduce": "mpi:all_reduce", "allreduce_coalesced": "mpi:all_reduce_coalesced",
           "all_to_all_single": "mpi:all_to_all"}


def _nothing() -> None:
    pass


class MPIProcessGroup(DataMovement, dist.ProcessGroup):
    """All ranks of one MPI communicator, as a torch process group."""

    # allreduce_coalesced takes the tensors where they lie (no flat copy): Communicator.allreduce
    # hands lists straight to it
    gathers_lists = True

    def __init__(self, comm: MPI.Intracomm, timeout_s: float, cuda_aware: bool,
                 on_shutdown: Callable[[], None] | None = None, name: str = "default group") -> None:
        super().__init__(comm.Get_rank(), comm.Get_size())
        self._comm, self._r, self._n = comm, comm.Get_rank(), comm.Get_size()
        self._name = name  # for messages: "default group", "group of ranks 0, 2"
        self._timeout_s, self._cuda_aware = timeout_s, cuda_aware
        self._on_shutdown = on_shutdown
        self._shm = ShmCollectives(comm, timeout_s)  # large allreduces, within and between nodes (lazily)
        self._data = DataPhase(comm, timeout_s, name)  # MPI's part of each collective: ``data_phase``
        # which way each kind of call goes (``routing``); the short paths read its routes directly
        self._router = Router(comm, timeout_s, self._shm, self._data,
                              {"allreduce": self._allreduce_by, "broadcast": self._broadcast_by,
                               "allgather": self._allgather_by})
        self._routes = self._router.routes
        self._open = True
        self._group_name = ""

    def getBackendName(self) -> str:
        return "mpi"

    # torch keeps a group's name in its C++ backends, and this group has none (it is its own
    # backend), so ProcessGroup.group_name would raise "ProcessGroup name not set" -- which
    # destroy_process_group(group) reads. torch names every group through _set_group_name.
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def __repr__(self) -> str:
        return f"MPIProcessGroup(rank={self._r}, size={self._n})"

    def _issue(self, name: str, fn, result: list, async_op: bool, gated: bool = False,
               inputs: list[torch.Tensor] = ()) -> dist._Work:
        """Run ``fn`` now or on the executor. ``gated``: every member must have issued the
        operation before ``fn`` starts (``liveness.gate``: the barrier); the data phases gate
        themselves where they make a blocking call (``data_phase``), and nonblocking ones and shared
        memory wait with deadlines of their own. ``inputs``: what the profiler's event records
        (``profiling``)."""
        if not self._open:
            raise RuntimeError(f"mpi backend: {name} on a process group that was shut down")
        if not async_op and not profiling.active():  # the common case, kept short
            if EXECUTOR.idle():
                self._guarded(name, fn, gated)
            else:
                EXECUTOR.run_now(self._guarded, self._timeout_s, name, fn, gated)
            return done(result)
        run = partial(self._guarded, name, fn, gated)
        if profiling.active():
            return self._issue_profiled(name, run, result, async_op, inputs)
        return EXECUTOR.submit(name, run, result, self._timeout_s)

    def _issue_profiled(self, name: str, run, result: list, async_op: bool,
                        inputs: list[torch.Tensor]) -> dist._Work:
        """``_issue`` while a profiler records: the operation's event spans it (``profiling``)."""
        event = profiling.begin(_EVENTS.get(name, "mpi:" + name), inputs)
        if async_op:
            return EXECUTOR.submit(name, run, result, self._timeout_s, event)
        try:
            EXECUTOR.run_now(run, self._timeout_s)
        finally:
            profiling.end_elsewhere(event)
        return done(result)

    def _guarded(self, name: str, fn, gated: bool, *args) -> None:
        """``fn(*args)`` on the executing thread, watched: a wait past the timeout names the silent
        rank."""
        WATCHDOG.enter(name, self._timeout_s, self._name)
        try:
            if gated:
                gate(self._comm, self._timeout_s, name)
            fn(*args)
        except PeerTimeout as exc:
            raise self.explain(exc) from None
        finally:
            WATCHDOG.leave()

    def explain(self, timeout: PeerTimeout) -> CommTimeout:
        return explain(timeout, self._name)

    def _direct(self, python_kernel: bool = False) -> bool:
        """May CUDA memory go to MPI as is? (A Python reduction kernel reads host memory.)"""
        return self._cuda_aware and not python_kernel

    # -- reductions ---------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        k = kind(opts.reduceOp)
        if not opts.asyncOp and len(tensors) == 1:  # the short path, once a call of its kind took it
            t = tensors[0]
            route = self._routes.get(("allreduce", t.nbytes, t.dtype, k, True))
            # the short path's checks (``routing.Route``), inlined
            if route is not None and route.short and t.is_cpu and t.is_contiguous() and self._open \
                    and EXECUTOR.idle() and not profiling.active():
                try:
                    if route.shm_c is not None:
                        self._shm.allreduce_in_c(t, *route.shm_c)
                    else:
                        self._data.collective(*route.c_call, 0, t.data_ptr())
                        if route.divide:
                            t.div_(route.divide)
                except PeerTimeout as exc:
                    raise self.explain(exc) from None
                return None  # done: no work to wait for
        t = lists.one(tensors, "allreduce")
        red = reduction(opts.reduceOp, t.dtype)
        if t.is_cpu and t.is_contiguous():  # the common case, kept short: MPI works on t itself
            return self._issue("allreduce", partial(self._allreduce_in_place, t, red, k), tensors,
                               opts.asyncOp, inputs=tensors)
        x = Operand(t, True, self._direct(red.python))

        def run() -> None:
            self._allreduce_in_place(x.local, red, k)
            x.finish()

        return self._issue("allreduce", run, tensors, opts.asyncOp, inputs=tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        for t in tensors:
            if t.dtype != tensors[0].dtype:
                raise TypeError("mpi backend: allreduce_coalesced needs tensors of one dtype")
        red, k = reduction(opts.reduceOp, tensors[0].dtype), kind(opts.reduceOp)
        if self._shm.takes_many(tensors, red.kernel):  # no packing: the slots are the buffer
            local = [t if t.is_contiguous() else t.contiguous() for t in tensors]

            def run_many() -> None:
                self._shm.allreduce_many(local, red.kernel, red.average, red.op)
                for t, x in zip(tensors, local, strict=True):
                    if x is not t:
                        t.copy_(x)

            return self._issue("allreduce_coalesced", run_many, tensors, opts.asyncOp,
                               inputs=tensors)
        counts = [t.numel() for t in tensors]
        flat = lists.concat(tensors, counts, self._direct(red.python))

        def run() -> None:
            self._allreduce_in_place(flat, red, k)
            lists.split_into(flat, counts, tensors)

        return self._issue("allreduce_coalesced", run, tensors, opts.asyncOp,
                           inputs=tensors)

    def _allreduce_in_place(self, local: torch.Tensor, red, k: int) -> None:
        """On the executing thread: the route of its kind (``k``: the reduction's ``kind``)."""
        self._allreduce_by(self._router.allreduce(local, red, k), local, red)

    def _allreduce_by(self, route: Route, local: torch.Tensor, red) -> None:
        if route.path == "shm":
            self._shm.allreduce(local, red.kernel, red.average, red.op)
            return
        if route.c_call is not None:
            self._data.collective(*route.c_call, 0, local.data_ptr())
        else:
            self._data("Allreduce", MPI.IN_PLACE, spec(local), red.op, blocking=route.path == "mpi")
        if red.average:
            local.div_(self._n)

    def reduce(self, tensors, opts):
        t = lists.one(tensors, "reduce")
        red = reduction(opts.reduceOp, t.dtype)
        root, n = opts.rootRank, self._n
        x = Operand(t, self._r == root, self._direct(red.python))

        def run() -> None:
            if red.kernel is not None and self._shm.moves(x.local, x.local.nbytes, SHM_DATA_BYTES):
                self._shm.reduce(x.local, red.kernel, red.average, root)
            elif x.write:  # the root
                self._data("Reduce", MPI.IN_PLACE, x.spec(), red.op, root)
                if red.average:
                    x.local.div_(n)
            else:
                self._data("Reduce", x.spec(), None, red.op, root)
            if x.write:
                x.finish()

        return self._issue("reduce", run, tensors, opts.asyncOp, inputs=tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        y = lists.one(output_tensors, "reduce_scatter")
        inputs = input_tensors[0] if len(input_tensors) == 1 else []
        counts = lists.same(inputs, y, self._n, "reduce_scatter")
        if counts[self._r] != y.numel():
            raise ValueError(f"mpi backend: reduce_scatter output has {y.numel()} elements, "
                             f"but this rank's input has {counts[self._r]}")
        red = reduction(opts.reduceOp, y.dtype)
        direct = self._direct(red.python)
        flat, out = lists.concat(inputs, counts, direct), Operand(y, True, direct)
        return self._issue("reduce_scatter", self._reduce_scatter(flat, out, counts, red),
                           output_tensors, opts.asyncOp, inputs=inputs)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return self._issue("reduce_scatter_tensor", self._reduce_scatter_into(output, input, opts),
                           [output], opts.asyncOp, inputs=[input])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        runs = [self._reduce_scatter_into(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return self._issue("reduce_scatter_tensor_coalesced", lambda: [r() for r in runs], outputs,
                           opts.asyncOp, inputs=inputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _reduce_scatter_into(self, output: torch.Tensor, input: torch.Tensor, opts):
        check_dtype(input.dtype, "reduce_scatter_tensor")
        if input.dtype != output.dtype or input.numel() != self._n * output.numel():
            raise ValueError(f"mpi backend: reduce_scatter_tensor needs an input of {self._n} x the "
                             f"output's elements and dtype; got {input.numel()} {input.dtype} for "
                             f"{output.numel()} {output.dtype}")
        red = reduction(opts.reduceOp, input.dtype)
        direct = self._direct(red.python)
        x, y = Operand(input, False, direct), Operand(output, True, direct)
        flat = x.local.clone() if lists.overlaps(x.local, y.local) else x.local  # MPI forbids aliasing
        return self._reduce_scatter(flat, y, [output.numel()] * self._n, red)

    def _reduce_scatter(self, flat: torch.Tensor, out: Operand, counts: list[int], red):
        n = self._n

        def run() -> None:
            if len(set(counts)) == 1:
                route = self._router.reduce_scatter(flat, out.local, red)
                if route.c_call is not None:
                    self._data.collective(*route.c_call, flat.data_ptr(), out.local.data_ptr())
                else:
                    self._data("Reduce_scatter_block", spec(flat, counts[0]), out.spec(), red.op,
                               blocking=route.path == "mpi")
            else:
                self._data("Reduce_scatter", spec(flat), out.spec(), counts, red.op)
            if red.average:
                out.local.div_(n)
            out.finish()

        return run

    def barrier(self, opts=None):
        return self._issue("barrier", _nothing, [], asynchronous(opts), gated=True)  # the gate is it

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not reach it within ``timeout`` (``monitored``);
        ``dist.monitored_barrier`` calls it, and torch's C++ through the device's backend."""
        if not self._open:
            raise RuntimeError("mpi backend: monitored_barrier on a process group that was shut down")
        EXECUTOR.check()
        monitored.barrier(self._comm, _seconds(timeout, self._timeout_s), self._timeout_s,
                          wait_all_ranks, self.explain, self._name)

    # -- point to point -----------------------------------------------------------------------
    def send(self, tensors, dstRank, tag):
        t = lists.one(tensors, "send")
        x = Operand(t, False, self._direct())
        EXECUTOR.check()
        request = self._comm.Isend(x.spec(), dstRank, tag)
        event = profiling.begin("mpi:send", tensors) if profiling.active() else None
        return RequestWork(request, tensors, self._timeout_s, f"send to rank {dstRank}", self.explain,
                           keep=x.local, group=self._name, event=event)

    def recv(self, tensors, srcRank, tag):
        return self._recv(tensors, srcRank, tag)

    def recv_anysource(self, tensors, tag):
        return self._recv(tensors, MPI.ANY_SOURCE, tag)

    def _recv(self, tensors, source: int, tag: int):
        t = lists.one(tensors, "recv")
        y = Operand(t, True, self._direct())
        EXECUTOR.check()
        request = self._comm.Irecv(y.spec(), source, tag)
        anysource = source == MPI.ANY_SOURCE
        event = None
        if profiling.active():
            event = profiling.begin("mpi:recvAnySource" if anysource else "mpi:recv", tensors)
        what = "recv from any rank" if anysource else f"recv from rank {source}"
        return RequestWork(request, tensors, self._timeout_s, what, self.explain, finish=y.finish,
                           group=self._name, event=event)

    # -- life cycle ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Finish queued work and free the communicator (``destroy_process_group`` calls this)."""
        if not self._open:
            return
        self._open = False
        try:
            EXECUTOR.release()
        finally:
            self._shm.close()
            if not MPI.Is_finalized():
                self._comm.Free()
            if self._on_shutdown is not None:
                self._on_shutdown()

