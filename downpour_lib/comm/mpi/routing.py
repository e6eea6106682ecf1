"""One group's routing: which way each kind of call moves its data, chosen once, kept as a ``Route``.

Every ``MPIProcessGroup`` owns one ``Router``. A collective's first call of a kind (operation,
bytes, dtype, what else decides it, whether its buffer is on the CPU) asks it for a ``Route``: the
path (``paths.PATHS``: shared memory, the gate and MPI's blocking call, or MPI's nonblocking call)
from the measured table (``paths``), or from the timing trial where the table cannot know this
machine (``tuning``: broadcast and allgather, and a 2-rank allreduce, at a size class's first
call); plus what running it takes, made once: the C data phase's MPI call with its arguments
(``DataPhase.prepared``), or the codes of the C steps over shared memory. Every later call of the
kind reads the route from one dictionary (``routes``). A synchronous call on the caller's thread
reads it too, and where the route is ``short`` skips the executor (``process_group``'s short
paths): those reads are the hot path, so a route is a named tuple (its fields read at C speed).

Routes are chosen on the executing thread, in the order the group's calls run, and each choice is
the same on every rank: it depends only on what the ranks share (the table, the agreed shared
memory, the trial's slowest-rank medians), so every rank's call takes the same path. A choice that
times paths is collective, as the call that asks is. docs/mpi_design.md, "How a call is routed",
has the design.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
import torch.distributed as dist
from mpi4py import MPI

from . import tuning
from .data_phase import DataPhase
from .liveness import wait_request
from .paths import PATHS, choose
from .shm import MIN_BYTES
from .shm_data import ShmCollectives
from .types import MOVE_TYPE, reduction, spec

ROUTES_KEPT = 1024  # the most kinds of call a group remembers: a run has a few; a sweep need not grow it
# the operations a route's ``c_call`` is made for, by MPI's name
_MPI_NAME = {"allreduce": "Allreduce", "broadcast": "Bcast", "allgather": "Allgather",
             "reduce_scatter": "Reduce_scatter_block"}


class Route(NamedTuple):
    """How one kind of call moves its data."""

    path: str  # "shm", "mpi" (the gate, then MPI's blocking call) or "nb" (``paths.PATHS``)
    c_call: tuple | None = None  # the C data phase's call before the buffers (``DataPhase.prepared``)
    shm_c: tuple | None = None  # an allreduce's C steps over shared memory (``ShmAllreduce.c_codes``)
    divide: int = 0  # an average made by ``c_call``: divide the sum by this many ranks after it
    short: bool = False  # a synchronous call of this kind on contiguous CPU buffers skips the executor


class Undecided:
    """A size class whose fastest path on written buffers (``written``) is not its fastest on
    reused ones (``reused``): which the program has is seen at the class's second call, against
    the first's send buffer (``first``: a weak reference to it and its version, set at that call).
    A program that writes its buffers between calls, as training does, bumps their version (or
    sends another tensor); one that sends the same buffer again as it is, as nccl-tests and OSU
    do, does not."""

    def __init__(self, written: str, reused: str) -> None:
        self.written, self.reused = written, reused
        self.first: tuple | None = None

    def mark(self, source: torch.Tensor | None) -> None:
        """At the class's first call: remember its send buffer."""
        self.first = (weakref.ref(source), _version(source)) if source is not None else ()

    def decide(self, source: torch.Tensor | None, slowest) -> str:
        """``reused`` where every rank's ``source`` is the first call's, unwritten since
        (collective: ``slowest``, the ranks' largest, of each rank's "written")."""
        same = bool(self.first) and source is not None and self.first[0]() is source \
            and self.first[1] is not None and _version(source) == self.first[1]
        return self.written if slowest([0.0 if same else 1.0])[0] else self.reused


def _version(t: torch.Tensor) -> int | None:
    """How many times torch has written ``t`` in place; None for a tensor made in inference mode,
    which keeps no count."""
    try:
        return t._version
    except RuntimeError:
        return None


class Router:
    """The routes of one group on ``comm``: the measured table, the timing trial and the routes
    chosen so far. ``run[op](route, *args)`` runs one call of ``op`` on a route (the group's
    ``_allreduce_by``, ``_broadcast_by`` or ``_allgather_by``): the trial times the paths with it."""

    def __init__(self, comm: MPI.Intracomm, timeout_s: float, shm: ShmCollectives, data: DataPhase,
                 run: dict[str, Callable[..., None]]) -> None:
        self._comm, self._n, self._timeout_s = comm, comm.Get_size(), timeout_s
        self._shm, self._data, self._run = shm, data, run
        # (op, bytes, dtype, what else decides it, on the CPU) -> the ``Route`` its calls take
        self.routes: dict[tuple, Route] = {}
        # (op, ``tuning.size_class``) -> the path the trial timed fastest, or ``Undecided`` until
        # the class's second call where its written and reused buffers' paths differ
        self.trials: dict[tuple, str | Undecided] = {}

    # -- the routes the group's operations ask for (on the executing thread) ---------------------
    def allreduce(self, local: torch.Tensor, red, kind: int) -> Route:
        """The route of an allreduce of ``local`` with the reduction ``red`` (of ``kind``)."""
        key = ("allreduce", local.nbytes, local.dtype, kind, local.is_cpu)
        route = self.routes.get(key)
        if route is None:
            route = self._keep(key, self.make("allreduce", self.allreduce_path(local, red), local,
                                              red=red))
        return route

    def broadcast(self, local: torch.Tensor, root: int) -> Route:
        """The route of a broadcast of ``local`` from ``root``."""
        key = ("broadcast", local.nbytes, local.dtype, root, local.is_cpu)
        return self.routes.get(key) or self._move(key, local, local.nbytes, local, root=root)

    def allgather(self, local: torch.Tensor, flat: torch.Tensor) -> Route:
        """The route of an allgather of ``local`` (every rank's the same size) into ``flat``."""
        key = ("allgather", flat.nbytes, flat.dtype, local.nbytes, local.is_cpu)
        return self.routes.get(key) or self._move(key, local, flat.nbytes, flat, local)

    def reduce_scatter(self, flat: torch.Tensor, out: torch.Tensor, red) -> Route:
        """The route of a reduce_scatter of ``flat`` into ``out`` (every rank's block the same)."""
        key = ("reduce_scatter", flat.nbytes, flat.dtype, red, flat.is_cpu)
        route = self.routes.get(key)
        if route is None:
            path = "nb" if red.python else self.path("reduce_scatter", flat, flat.nbytes)
            route = self._keep(key, self.make("reduce_scatter", path, out, flat, red=red))
        return route

    def make(self, op: str, path: str, recv: torch.Tensor, send: torch.Tensor | None = None,
             red=None, root: int = 0) -> Route:
        """The route of ``op`` on ``path`` for buffers of ``recv``'s (and ``send``'s) size and
        dtype: with the C data phase's call made once where C can make it, and ``short`` where a
        synchronous call may skip the executor (its steps are in C on every rank)."""
        in_c = self._shm.in_c
        if path == "shm":
            codes = self._shm.c_codes(recv.dtype, red.kernel, red.average) \
                if op == "allreduce" else None
            short = codes is not None if op == "allreduce" else in_c and recv.dtype in MOVE_TYPE
            return Route("shm", shm_c=codes, short=short)
        call = None
        if red is None or not red.python:
            call = self._data.prepared(
                _MPI_NAME[op], recv, send, reduce=None if red is None else red.op, root=root,
                count=None if send is None or op != "allgather" else send.numel(),
                blocking=path == "mpi")
        divide = self._n if op == "allreduce" and red.average and call is not None else 0
        short = call is not None and in_c and op != "reduce_scatter" and recv.nbytes > 0
        return Route(path, c_call=call, divide=divide, short=short)

    # -- choosing a path --------------------------------------------------------------------------
    def _move(self, key: tuple, tensor: torch.Tensor, nbytes: int, recv: torch.Tensor,
              send: torch.Tensor | None = None, root: int = 0) -> Route:
        """The route of broadcast or allgather (``key[0]``) for ``nbytes`` (the whole buffer),
        kept unless its size class is ``Undecided`` (the class's next call decides)."""
        op = key[0]
        path = self.path(op, tensor, nbytes)
        route = self.make(op, path, recv, send, root=root)
        if isinstance(self.trials.get((op, tuning.size_class(nbytes))), Undecided):
            return route
        return self._keep(key, route)

    def path(self, op: str, tensor: torch.Tensor, nbytes: int) -> str:
        """Where broadcast, allgather or reduce_scatter moves ``nbytes`` (the whole buffer): on one
        node the measured path (``paths``; for broadcast and allgather with the steps in C, the
        one timed at the size class's first call: ``tuning``), else MPI's nonblocking calls
        (``data_phase``). ``tensor``: this rank's send buffer (``Undecided`` reads it)."""
        if not self._shm.moves(tensor, nbytes, 0):
            return "nb"
        path = choose(op, nbytes, self._n, self._shm.in_c)
        if self._shm.in_c and tuning.tunes(op, nbytes, self._n):
            path = self._tuned_path(op, tensor.dtype, nbytes, path, tensor)
        return path

    def allreduce_path(self, local: torch.Tensor, red) -> str:
        if not self._shm.takes(local, red.kernel):
            return "nb"
        if self._shm.across or red.python:  # MPI's own across nodes; a Python operator in MPI
            return "shm" if local.nbytes >= MIN_BYTES else "nb"
        # a group on one node takes the measured path: TABLE_C's where C has the reduction's kernel
        in_c = self._shm.reduces_in_c(local.dtype, red.kernel, red.average)
        path = choose("allreduce", local.nbytes, self._n, in_c)
        if in_c and tuning.tunes("allreduce", local.nbytes, self._n):  # 2 ranks: timed
            path = self._tuned_path("allreduce", local.dtype, local.nbytes, path)
        return path

    def _keep(self, key: tuple, route: Route) -> Route:
        if len(self.routes) < ROUTES_KEPT:
            self.routes[key] = route
        return route

    # -- the timing trial ---------------------------------------------------------------------------
    def _tuned_path(self, op: str, dtype: torch.dtype, nbytes: int, default: str,
                    source: torch.Tensor | None = None) -> str:
        """The path ``op`` takes for ``nbytes`` of ``dtype``: the one the group timed for its
        size class, timed now at the class's first call (collective, as that call is). Where the
        winner on reused buffers is another path (``tuning.reuse_matters``), the first call takes
        the written buffers' and the class's second call decides (``Undecided.decide``): the
        reused buffers' where every rank sends again what it sent at the first call (``source``,
        this rank's send buffer) untouched."""
        cls = (op, tuning.size_class(nbytes))
        path = self.trials.get(cls)
        if path is None:
            written, reused = self._time_paths(op, dtype, nbytes, default)
            path = self.trials[cls] = written if reused in (None, written) else \
                Undecided(written, reused)
        if isinstance(path, Undecided):
            if path.first is None:  # this is the first call: it takes the written buffers' path
                path.mark(source)
                return path.written
            path = self.trials[cls] = path.decide(source, self.slowest)
        return path

    def _time_paths(self, op: str, dtype: torch.dtype, nbytes: int,
                    default: str) -> tuple[str, str | None]:
        """``tuning.fastest`` of ``op``'s paths (broadcast, allgather, or allreduce as a sum), on
        scratch buffers of ``nbytes`` (allgather's output) of ``dtype``, each path's route made as
        a call's would be: written before each call, and sent again as they are where that
        matters (``tuning.reuse_matters``)."""
        item = torch.empty(0, dtype=dtype).element_size()
        names = tuning.candidates(PATHS, nbytes)
        x = torch.zeros(max(1, nbytes // (item * (self._n if op == "allgather" else 1))), dtype=dtype)
        if op == "broadcast":
            calls = {p: partial(self._run[op], self.make(op, p, x), x, 0) for p in names}
        elif op == "allgather":
            out = torch.empty(x.numel() * self._n, dtype=dtype)
            calls = {p: partial(self._run[op], self.make(op, p, out, x), x, out) for p in names}
        else:  # zeros, written before each call, sum to zeros: no call overflows
            red = reduction(dist.ReduceOp.SUM, dtype)
            calls = {p: partial(self._run[op], self.make(op, p, x, red=red), x, red) for p in names}
        return tuning.fastest(calls, x.zero_, partial(self._aligned, op), self.slowest, default,
                              nbytes, reused=tuning.reuse_matters(op, nbytes))

    def _aligned(self, what: str) -> None:
        """A barrier every rank leaves within microseconds of the others: it spins for
        ``tuning.ALIGN_SPIN_S`` before it naps (a rank gone silent is still named at the
        deadline)."""
        wait_request(self._comm.Ibarrier(), self._timeout_s, what, spin_s=tuning.ALIGN_SPIN_S)

    def slowest(self, values: list[float]) -> list[float]:
        """Each of ``values``, the largest any rank has (collective)."""
        t = torch.tensor(values, dtype=torch.float64)
        self._data("Allreduce", MPI.IN_PLACE, spec(t), MPI.MAX, blocking=True)
        return t.tolist()
