"""``MPIProcessGroup``'s routes: which path a call's data takes, and the short paths' learning.

A mixin of the group (``process_group``; with ``movement``'s), whose state it keeps up to date:

* the path of each kind of call (``_paths``): on one node the measured table's (``paths``), or, from
  ``tuning.MIN_BYTES`` where the steps are in C, the one the group timed at the size class's first
  call (``_tuned``: broadcast and allgather, and a 2-rank allreduce, whose paths give the same
  bits), or at its second where the winner depends on whether buffers are sent again unwritten
  (``Undecided``); across nodes MPI's nonblocking calls or the shared memory's node-level steps;
* how a synchronous call of a kind already seen skips ``_issue`` (the short paths, ``Routes``): the
  shared-memory steps in C, or the C data phase's MPI call with its arguments made once
  (``_c_calls``, ``_data_in_c``), learned per kind (``_in_c`` for allreduce, ``_moves_in_c``).
"""

from __future__ import annotations

import weakref
from functools import partial

import torch
import torch.distributed as dist
from mpi4py import MPI

from . import tuning
from .liveness import wait_request
from .paths import PATHS, choose
from .shm import MIN_BYTES
from .types import MOVE_TYPE, kind, reduction, spec

PATHS_KEPT = 256  # the most choices of each kind a group remembers (``_remember``, ``_c_calls``)


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


class Routes:
    """The path choice and the short paths' state of ``MPIProcessGroup``.

    The short paths: a synchronous allreduce, broadcast or all_gather_into_tensor that passed its
    own checks skips ``_issue`` where ``_issue`` would run it at once and its steps are in C: the
    group is open, nothing is queued ahead of it (``EXECUTOR.idle``), no profiler records, and a
    call of its kind (bytes, dtype, what else decides it) learned its C steps (``_in_c`` for
    allreduce, ``_moves_in_c`` for the others: ``_learn_move``). A short path calls the C steps
    (shared memory's, or the C data phase's MPI call with its arguments made once) and nothing
    else of ``_guarded``: their waits give up at the group's deadline and on the watchdog's word by
    themselves, note themselves for its probe answers once they spin out, and mark a blocking call
    committed with what it is, its group and since when (``native_shm.c``, ``native_calls.c``),
    which the watchdog reads as it reads its table, so the table is not entered. It returns no work
    (None), as torch's backends that synchronize in C++ do: torch's synchronous collectives take
    None. The checks are inlined in each operation, one dictionary read for what it learned: a 4 KB
    allreduce through torch, 2 ranks, in turns: 7.4 us through ``_guarded`` and a work, 5.9-6.1
    without (Open MPI's own 4.1-4.3). Called directly (2 ranks, p50 of 2,000 in turns), over the C
    data phase alone: a 64 KB broadcast 1.9 us with the checks in a method and two reads (the
    path's, the C call's), 1.5 inlined with one; a 64 KB all_gather_into_tensor 2.9 and 1.7 (1 MB:
    7.6 and 3.9), and through torch 10.8 and 9.7 us (Open MPI's own 4.6).
    """

    def _learn_move(self, key: tuple, op: str, t: torch.Tensor, nbytes: int, *what) -> tuple | bool | None:
        """What the short path of broadcast or all_gather_into_tensor (``op``) makes for calls of
        ``key``'s kind, ``t`` the tensor whose dtype ``_c_calls`` keys it by, ``nbytes`` the whole
        buffer, ``what`` what else decides the call (broadcast's root): ``(made,)`` where its path
        is the C data phase's MPI call of ``made`` (``_c_calls``), ``(None,)`` where it is the C
        steps over shared memory, False where it is neither (each kept for every later call of the
        kind); None, with nothing kept, until the kind has a path and its C call is made (its first
        calls, through ``_issue``, choose and make them)."""
        path = self._paths.get((op, nbytes, True))
        if path is None or not self._shm.in_c:
            return None
        if t.dtype not in MOVE_TYPE:
            found: tuple | bool = False
        elif path == "shm":
            found = (None,)
        else:
            made = self._c_calls.get((op, nbytes, t.dtype, *what, path))
            if made is None:
                return None
            found = (made,) if made else False
        if len(self._moves_in_c) < PATHS_KEPT:
            self._moves_in_c[key] = found
        return found

    def _path(self, op: str, tensor: torch.Tensor, nbytes: int) -> str:
        """Where broadcast, allgather or reduce_scatter moves ``nbytes`` (the whole buffer): on one
        node the measured path (``paths``; for broadcast and allgather with the steps in C, timed
        here at the size class's first call: ``tuning``), else MPI's nonblocking calls
        (``data_phase``). Collective where it times the paths, as every call that asks is."""
        key = (op, nbytes, tensor.is_cpu)
        path = self._paths.get(key)
        if path is not None:
            return path
        if not self._shm.moves(tensor, nbytes, 0):
            return self._remember(key, "nb")
        path = choose(op, nbytes, self._n, self._shm.in_c)
        if self._shm.in_c and tuning.tunes(op, nbytes, self._n):
            path = self._tuned_path(op, tensor.dtype, nbytes, path, tensor)
            if isinstance(self._tuned[op, tuning.size_class(nbytes)], Undecided):
                return path  # not kept: the class's next call decides (``_tuned_path``)
        return self._remember(key, path)

    def _allreduce_path(self, local: torch.Tensor, red) -> str:
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

    def _remember(self, key: tuple, path: str) -> str:
        """Keep the path chosen for ``key`` (``_paths``); returns it."""
        if len(self._paths) < PATHS_KEPT:  # a run has a few sizes; a sweep need not grow it
            self._paths[key] = path
        return path

    def _tuned_path(self, op: str, dtype: torch.dtype, nbytes: int, default: str,
                    source: torch.Tensor | None = None) -> str:
        """The path ``op`` takes for ``nbytes`` of ``dtype``: the one the group timed for its
        size class, timed now at the class's first call (collective, as that call is). Where the
        winner on reused buffers is another path (``tuning.reuse_matters``), the first call takes
        the written buffers' and the class's second call decides (``Undecided.decide``): the
        reused buffers' where every rank sends again what it sent at the first call (``source``,
        this rank's send buffer) untouched."""
        cls = (op, tuning.size_class(nbytes))
        path = self._tuned.get(cls)
        if path is None:
            written, reused = self._time_paths(op, dtype, nbytes, default)
            path = self._tuned[cls] = written if reused in (None, written) else \
                Undecided(written, reused)
        if isinstance(path, Undecided):
            if path.first is None:  # this is the first call: it takes the written buffers' path
                path.mark(source)
                return path.written
            path = self._tuned[cls] = path.decide(source, self._slowest)
        return path

    def _time_paths(self, op: str, dtype: torch.dtype, nbytes: int,
                    default: str) -> tuple[str, str | None]:
        """``tuning.fastest`` of ``op``'s paths (broadcast, allgather, or allreduce as a sum),
        on scratch buffers of ``nbytes`` (allgather's output) of ``dtype``: written before each
        call, and sent again as they are where that matters (``tuning.reuse_matters``)."""
        item = torch.empty(0, dtype=dtype).element_size()
        names = tuning.candidates(PATHS, nbytes)
        x = torch.zeros(max(1, nbytes // (item * (self._n if op == "allgather" else 1))), dtype=dtype)
        if op == "broadcast":
            calls = {p: partial(self._broadcast_by, p, x, 0) for p in names}
        elif op == "allgather":
            out = torch.empty(x.numel() * self._n, dtype=dtype)
            calls = {p: partial(self._allgather_by, p, x, out) for p in names}
        else:  # zeros, written before each call, sum to zeros: no call overflows
            red = reduction(dist.ReduceOp.SUM, dtype)
            calls = {p: partial(self._allreduce_by, p, x, red) for p in names}
        return tuning.fastest(calls, x.zero_, partial(self._aligned, op), self._slowest, default,
                              nbytes, reused=tuning.reuse_matters(op, nbytes))

    def _aligned(self, what: str) -> None:
        """A barrier every rank leaves within microseconds of the others: it spins for
        ``tuning.ALIGN_SPIN_S`` before it naps (a rank gone silent is still named at the
        deadline)."""
        wait_request(self._comm.Ibarrier(), self._timeout_s, what, spin_s=tuning.ALIGN_SPIN_S)

    def _slowest(self, values: list[float]) -> list[float]:
        """Each of ``values``, the largest any rank has (collective)."""
        t = torch.tensor(values, dtype=torch.float64)
        self._data("Allreduce", MPI.IN_PLACE, spec(t), MPI.MAX, blocking=True)
        return t.tolist()

    def _learn_in_c(self, t: torch.Tensor, red, op: dist.ReduceOp) -> None:
        """After a synchronous allreduce of the contiguous CPU ``t``: whether later ones like it
        take the short path (``Routes``): where the path ``_allreduce_in_place`` chose is the C
        steps over shared memory, or MPI's call that the C data phase makes."""
        if len(self._in_c) < PATHS_KEPT:
            path = self._paths.get(("allreduce", t.nbytes, True, red))
            codes = self._shm.c_codes(t.dtype, red.kernel, red.average) if path == "shm" else None
            made = self._c_calls.get(("allreduce", t.nbytes, t.dtype, red, path)) \
                if path is not None and path != "shm" and self._shm.in_c else None
            found = (codes, None, 0) if codes else (None, made, self._n if red.average else 0) \
                if made else False
            self._in_c[(t.nbytes, t.dtype, kind(op))] = found

    def _data_in_c(self, key: tuple, op: str, recv: torch.Tensor, send: torch.Tensor | None = None,
                   **how) -> bool:
        """``DataPhase.in_c`` of ``op``, its arguments made once for every call of ``key``'s kind
        (``_c_calls``); False where C cannot make it (the caller makes it in Python)."""
        made = self._c_calls.get(key)
        if made is None:
            made = self._data.prepared(op, recv, send, **how) or False
            if len(self._c_calls) < PATHS_KEPT:
                self._c_calls[key] = made
        if made:
            self._data.collective(*made, 0 if send is None else send.data_ptr(), recv.data_ptr())
        return bool(made)
