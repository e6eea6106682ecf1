"""The data phase of a collective: the MPI call that moves its buffers, and how it waits.

``MPIProcessGroup`` checks a collective's arguments, stages its buffers and picks a path
(``paths``); what reaches MPI goes through one ``DataPhase`` per group, which decides between
MPI's nonblocking call waited on with naps, the same cut into pieces, and the blocking call after
the gate (``liveness.gate``), so that a rank stopped before or inside a collective leaves the
others asleep until the group's deadline names it, rather than spinning inside MPI.

Allreduce, broadcast, allgather and reduce_scatter_block make the same data phase in C where it is
built (``native``; ``in_c``), in the form ``__call__`` takes (``_form``): the same calls, waits,
deadlines and watchdog marks, without the interpreter between them (issue 36: through torch, a 4 KB
allreduce on 2 ranks took 3.5-3.7x Open MPI's own call against 4.4-4.7x in Python, a 64 KB
allgather 1.7-2.3x against 3.0x). Everything else, and every call where it is not built, is
``__call__``'s.
"""

from __future__ import annotations

import torch
from mpi4py import MPI

from . import native
from .liveness import gate, wait_request
from .types import MOVE_TYPE

# The largest data phase waited on with naps (``DataPhase``): at and below it libnbc's
# nonblocking collectives cost what the blocking ones do (16 KB: the same; 128 KB gradients of the
# default mlp: ~0.05 ms more a reduce), above it they lose by multiples.
SLEEPY_DATA_BYTES = 256 * 1024
# From this size a reduce on one node goes through shared memory (``shm_data``), which sleeps
# while it waits and beats Open MPI's blocking calls there (broadcast and allgather: ``paths``).
SHM_DATA_BYTES = SLEEPY_DATA_BYTES + 1
# Larger data phases that shared memory does not take (a group across nodes) go as pieces of
# SLEEPY_DATA_BYTES, this many in flight, each waited on with naps.
_SEGMENTED = frozenset({"Allreduce", "Reduce", "Bcast"})
_WINDOW = 4
# Behind the gate every member is inside the collective, and it ends within its data time: there an
# allreduce of up to SLEEPY_DATA_BYTES is MPI's nonblocking call waited on spinning this long before
# the naps, so that a member stopped inside it leaves the others asleep, not spinning in MPI's
# blocking call until the watchdog ends the job (they spun at 99% of a core). Measured against the
# blocking call (``bench collectives --paths``, p50 over MPI's own, two sittings each, the 2-core
# VM): 3 ranks, 16-256 KB, 1.06-1.40 against 0.96-1.90; 8 ranks, 128 KB, 1.78-2.05 against
# 1.85-2.01; 4 ranks, 128 KB, 1.60 against 1.30. Above 256 KB, as pieces (``_segmented``), it lost
# 25-35% at 8 ranks (1-8 MB) and keeps the blocking call; allgather lost 20-60% from 64 KB and
# keeps it too. Naps alone, with no gate (the "nb" path), stretch libnbc's rounds: 2-4x.
_SPUN_BEHIND_GATE = frozenset({"Allreduce"})
_INT_MAX = (1 << 31) - 1
AFTER_GATE_SPIN_S = 5e-3
# Above SLEEPY_DATA_BYTES, what neither pieces nor shared memory take (reduce_scatter, an uneven
# allgather, an allgather across nodes) is, behind the gate, MPI's nonblocking call spun for about
# its data time and then waited on with naps (issue 61): MPI's blocking call had the others spin
# at 100% of a core for the whole timeout when a member stopped inside it. The spin keeps libnbc's
# rounds moving as the blocking call would (naps alone stretched a 1 MB reduce_scatter 9x: the
# table in ``paths``); measured against the blocking call, 2 ranks on one node of the loaded 2-core
# VM, best of 4 medians: reduce_scatter 0.88-1.00x at 0.5-8 MB, allgatherv 0.98-1.00x at 2-8 MB.
# Blocking, only reduce_scatter takes it: a one-node allgather's blocking path cost 2x at 512 KB.
_SPUN_LARGE = frozenset({"Reduce_scatter_block", "Reduce_scatter", "Allgather", "Allgatherv"})
_SPUN_LARGE_BLOCKING = frozenset({"Reduce_scatter_block"})
SPIN_BYTES_PER_S = 50e6  # the spin lasts this rate's time for the largest buffer (4 MB: 85 ms) ...
SPIN_SHARE = 1 / 20  # ... and at most this share of the timeout: the CPU a stopped member costs
# the collective's name in a timeout's message, where it is not the MPI call's in lower case
_NAMES = {"Bcast": "broadcast", "Allgather": "all_gather", "Allgatherv": "all_gather",
          "Gatherv": "gather", "Scatterv": "scatter", "Alltoallv": "all_to_all",
          "Reduce_scatter_block": "reduce_scatter"}
_PIECES = -1  # ``_form``: nonblocking pieces (``_segmented``), which only Python makes
_IN_C = {"Allreduce": native.ALLREDUCE, "Bcast": native.BCAST, "Allgather": native.ALLGATHER,
         "Reduce_scatter_block": native.REDUCE_SCATTER_BLOCK}
_SAME_SIZE_ON_EVERY_RANK = frozenset({"Allreduce", "Reduce", "Bcast", "Allgather", "Allgatherv",
                                      "Reduce_scatter_block", "Reduce_scatter"})


def _largest(op: str, args: tuple) -> int:
    """The bytes of the largest buffer among MPI ``op``'s ``args``, where it is the same on every
    rank, else 0. Every rank must take the same form (MPI matches blocking with blocking), so only
    such a size may decide; gather, scatter and all-to-all (whose buffers differ by rank) always
    take the nonblocking form."""
    largest = 0
    if op in _SAME_SIZE_ON_EVERY_RANK:
        for a in args:
            if isinstance(a, list) and a and a[0] is not None and len(a[0]) > largest:
                largest = len(a[0])
    return largest


def _form(op: str, nbytes: int, blocking: bool) -> int:
    """How MPI's ``op`` moves a largest buffer of ``nbytes`` (``DataPhase.__call__`` says why):
    ``native``'s NB, GATED or GATED_SPUN, or ``_PIECES``."""
    if blocking:
        spun = op in _SPUN_BEHIND_GATE if nbytes <= SLEEPY_DATA_BYTES else op in _SPUN_LARGE_BLOCKING
        return native.GATED_SPUN if spun else native.GATED
    if nbytes <= SLEEPY_DATA_BYTES:
        return native.NB
    if op in _SEGMENTED:
        return _PIECES
    return native.GATED_SPUN if op in _SPUN_LARGE else native.GATED  # only after the gate


def _spin_s(nbytes: int, timeout_s: float) -> float:
    """How long a ``GATED_SPUN`` wait spins for a largest buffer of ``nbytes`` before its naps."""
    if nbytes <= SLEEPY_DATA_BYTES:
        return AFTER_GATE_SPIN_S
    return max(AFTER_GATE_SPIN_S, min(AFTER_GATE_SPIN_S + nbytes / SPIN_BYTES_PER_S,
                                      timeout_s * SPIN_SHARE))


class DataPhase:
    """MPI's part of one group's collectives, on ``comm`` with the group's deadline."""

    def __init__(self, comm: MPI.Intracomm, timeout_s: float, group: str = "default group") -> None:
        self._comm, self._timeout_s, self._group = comm, timeout_s, group
        self._native = native.load()  # None: every data phase is __call__'s
        self._handle = comm.handle
        # ``collective(*prepared(...), send, recv)``: the C data phase, where it is built
        self.collective = None if self._native is None else self._native.collective

    def prepared(self, op: str, recv: torch.Tensor, send: torch.Tensor | None = None,
                 count: int | None = None, reduce: MPI.Op | None = None, root: int = 0,
                 blocking: bool = False) -> tuple | None:
        """The arguments of ``collective`` before the buffers' addresses, for ``in_c``'s call
        on tensors of ``recv``'s and ``send``'s sizes and dtype: the same for every such call
        (a short path keeps them); None where C cannot make it."""
        nbytes = recv.nbytes if send is None else max(recv.nbytes, send.nbytes)
        if self._native is None or nbytes >= _INT_MAX:
            return None
        mode = _form(op, nbytes, blocking)
        if mode == _PIECES:
            return None
        return (_IN_C[op], mode, self._handle, recv.numel() if count is None else count,
                MOVE_TYPE[recv.dtype].handle, 0 if reduce is None else reduce.handle, root,
                self._timeout_s, _spin_s(nbytes, self._timeout_s), _NAMES.get(op) or op.lower(),
                self._group)

    def in_c(self, op: str, recv: torch.Tensor, send: torch.Tensor | None = None,
             count: int | None = None, reduce: MPI.Op | None = None, root: int = 0,
             blocking: bool = False) -> bool:
        """MPI's ``op`` (allreduce, bcast, allgather or reduce_scatter_block) on contiguous
        tensors, as ``__call__`` would make it but in C with the GIL released, raising
        ``PeerTimeout`` as ``wait_request`` does; False, having done nothing, where it cannot (not
        built; the pieces of a large nonblocking call; 2 GB and more, whose counts may not fit the
        C int of MPI's classic calls). ``send`` None: in place; ``count``: the elements of
        ``recv``, or each rank's block where the buffers differ (allgather's is ``send``'s)."""
        args = self.prepared(op, recv, send, count, reduce, root, blocking)
        if args is None:
            return False
        self.collective(*args, 0 if send is None else send.data_ptr(), recv.data_ptr())
        return True

    def __call__(self, op: str, *args, blocking: bool = False) -> None:
        """MPI's ``op`` (``"Reduce"``...) on ``args``. Up to ``SLEEPY_DATA_BYTES`` it is the
        nonblocking form (``I`` + the name) waited on with naps and the group's deadline, with no
        gate before it (a missing member only makes the wait time out and name it; the gate's
        round trip was a third of a 4 KB allreduce): a member stopped before or inside it leaves
        the others asleep, not spinning inside a blocking call (sync_ps's ranks spun in ``reduce``
        at 50-100% of a core for the whole timeout). Above it Open MPI's nonblocking collectives
        (libnbc) lose to its blocking ones (measured, 2 ranks on one node: Ireduce 3-4x slower from
        256 KB, 7-70x from 4 MB once naps stretch its rounds; a 1 MB reduce took 112 ms against
        0.33 ms), so on one node broadcast, reduce and allgather go through shared memory
        (``shm_data``, before they get here) and allreduce too (``shm``), or MPI's blocking call
        after the gate where ``paths`` measured it faster (``blocking``); what is left here is cut
        into nonblocking pieces of ``SLEEPY_DATA_BYTES`` where the operation is elementwise
        (``_segmented``), and the rest (reduce_scatter, allgatherv, allgather across nodes) is,
        after the gate, MPI's nonblocking call spun for about its data time (``_spin_s``), then
        waited on with naps. ``blocking``: the gate, then MPI's blocking call (``paths.choose``
        found it faster there), or for an allreduce of up to ``SLEEPY_DATA_BYTES`` its nonblocking
        call waited on with a spin of ``AFTER_GATE_SPIN_S`` before the naps (as fast, and the
        waiting ranks sleep), and for a reduce_scatter above it with ``_spin_s``'s."""
        what = _NAMES.get(op) or op.lower()
        nbytes = _largest(op, args)
        form = _form(op, nbytes, blocking)
        if form == native.NB:
            wait_request(getattr(self._comm, "I" + op.lower())(*args), self._timeout_s, what)
        elif form == _PIECES:
            self._segmented(op, args, what)
        else:  # only once every member is here can a blocking call not wait on a missing one
            gate(self._comm, self._timeout_s, what)
            if form == native.GATED_SPUN:
                wait_request(getattr(self._comm, "I" + op.lower())(*args), self._timeout_s, what,
                             spin_s=_spin_s(nbytes, self._timeout_s))
            else:
                getattr(self._comm, op)(*args)

    def _segmented(self, op: str, args: tuple, what: str) -> None:
        """``op`` (elementwise: every element moves on its own) on ``args`` in pieces of
        ``SLEEPY_DATA_BYTES``, ``_WINDOW`` in flight, each waited on with naps."""
        start = getattr(self._comm, "I" + op.lower())
        buffers = [a for a in args if isinstance(a, list)]
        count, datatype = buffers[0][1], buffers[0][2]
        item = datatype.Get_extent()[1]
        step = max(1, SLEEPY_DATA_BYTES // item)
        pending = []
        for lo in range(0, count, step):
            k = min(step, count - lo)
            piece = [[MPI.buffer.fromaddress(a[0].address + lo * item, k * item), k, datatype]
                     if isinstance(a, list) else a for a in args]
            pending.append(start(*piece))
            if len(pending) >= _WINDOW:
                wait_request(pending.pop(0), self._timeout_s, what)
        for request in pending:
            wait_request(request, self._timeout_s, what)
