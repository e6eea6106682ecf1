"""Which path a broadcast or allgather takes on one node: timed where the group runs, at first use.

``paths.TABLE_C`` sent 2-rank broadcasts and allgathers to shared memory at every size: it won every
size on the day it was measured (0.32-0.85 of Open MPI's own). On another day, on the same kind of
2-core VM, ``bench collectives --paths`` gave (p50 over Open MPI's own, two sittings that agreed
within 0.04; shared memory / the gate's path, MPI's blocking call)::

    2 ranks                64 KB      256 KB     1 MB       4 MB       16 MB
    broadcast   reused     2.50/1.09  2.59/1.05  1.43/1.09  0.97/1.01  0.92/1.00
                written    1.23/1.03  1.16/1.01  0.81/1.01  0.92/1.00  0.90/1.00
    allgather   reused     1.33/1.01  1.56/1.07  1.66/1.10  1.36/1.00  1.35/1.01
                written    0.76/0.99  0.82/1.00  0.99/1.02  1.30/1.01  1.33/1.00

("reused": buffers sent again as they are, as nccl-tests and OSU do; "written": written before each
call, as training writes its buffers, ``--written``.) Open MPI moves a buffer with one copy (CMA)
where shared memory takes two, and which wins depends on how this machine's cores share their
caches, which a table measured on another cannot know. So a group whose steps are in C times the
three paths (``paths.PATHS``) once per operation and size class (a power of two) from ``MIN_BYTES``, at
its first call of the class, and takes the fastest: on scratch buffers of the call's size and
dtype, written before each call, in turns, the slowest rank's median, agreed by every rank (an
allreduce of the medians). The table's path stays unless another beats it by ``MARGIN``. The
paths move the same bytes, so which wins never changes a result; the trial calls are the paths'
own, with their deadlines, so a rank gone silent in a trial is named as in any call. It costs
each size class ``ROUNDS`` x (``reps`` + 1) calls of each path once: a 64 MB allgather's about
0.2 s, a 64 KB one's under 2 ms. Allreduce is timed the same way where the group has two ranks:
each element is then the one sum (or product) of the same two values on every path, so the bits
are the same whichever wins (``tests/mpi/tuned_paths.py`` checks them). On the day the table's
shared memory lost 2-rank allreduces of 1-16 MB by 1.09-1.20 against the gate's path's 0.99-1.01
(``bench collectives --paths --written``). With three or more ranks the paths reduce in different
orders, and a run's bits must not depend on a timing, so allreduce keeps the table there, as
reduce_scatter does everywhere.

Which path wins at 64 KB-1 MB depends on whether the buffers were written since they were last sent
(the table above), and a group cannot know that from one call. So below ``REUSED_BELOW`` broadcast
and allgather are timed both ways; where the two winners differ, the class's first call takes the
written buffers' and its second call decides (``routing.Undecided``): the reused buffers' where every
rank sends the tensor it sent at the first call with the same version (torch counts every in-place
write, as training's gradients and parameters get), else the written buffers'. The decision costs
one 8-byte allreduce, once per class; results are the same bits whichever path is taken.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from .data_phase import SLEEPY_DATA_BYTES

MOVES = ("broadcast", "allgather")  # timed at any number of ranks
MIN_BYTES = 16 << 10  # below, the table: shared memory took 0.53-0.71 of Open MPI's own at 4 KB
MARGIN = 0.05  # how much faster than the table's path another must be to replace it
# below, broadcast's and allgather's paths are timed on reused buffers too: there the winner moved
# with it (shared memory 0.76-0.99 of Open MPI's own written, 1.33-2.59 reused, at 64 KB-1 MB);
# from 4 MB the same path won both ways (the table above)
REUSED_BELOW = 4 << 20


def tunes(op: str, nbytes: int, n: int) -> bool:
    """Whether a group of ``n`` ranks on one node, with the steps in C, times ``op``'s paths for
    ``nbytes``: broadcast and allgather from ``MIN_BYTES``; allreduce too where it has two ranks,
    whose every path computes each element as the one sum (or product) of the same two values."""
    return nbytes >= MIN_BYTES and (op in MOVES or (op == "allreduce" and n == 2))


def candidates(names: tuple[str, ...], nbytes: int) -> tuple[str, ...]:
    """The paths worth timing for ``nbytes``: above ``SLEEPY_DATA_BYTES`` the nonblocking call is
    spun behind the gate (allgather: ``data_phase``), or pieces of it (broadcast, allreduce) that
    lost by 1.2-4x at every size measured (``paths``), so it is not timed there."""
    return names if nbytes <= SLEEPY_DATA_BYTES else tuple(p for p in names if p != "nb")


def size_class(nbytes: int) -> int:
    """The class of ``nbytes``: sizes between two powers of two share a trial."""
    return nbytes.bit_length()


ROUNDS = 3  # each path's calls come in this many blocks, in turns with the other paths'
# How long the barrier before each timed call spins before it naps: a rank that napped there left
# it up to a nap after the other, and the other's timed call waited for it. Aligned by the gate
# (naps from 50 us), the gate's path of a 16 MB allgather took 2.7-3.7 ms in three trials of four,
# Open MPI's own call 1.8-3.2 just before and after; aligned by a barrier that spins, 1.6-2.0 ms
# in five of five, the same as Open MPI's own.
ALIGN_SPIN_S = 0.1


def reps(nbytes: int) -> int:
    """Timed calls a path gets in each of the ``ROUNDS``: more for the sizes whose calls take
    microseconds, whose medians of a few calls chose a path 1.19x the fastest (64 KB broadcast,
    3 of 9 calls)."""
    return 9 if nbytes < 256 << 10 else 5 if nbytes < 1 << 20 else 3 if nbytes < 16 << 20 else 2


def reuse_matters(op: str, nbytes: int) -> bool:
    """Whether ``op``'s paths for ``nbytes`` are also timed on buffers sent again as they are:
    broadcast and allgather below ``REUSED_BELOW``, where which path wins depends on it."""
    return op in MOVES and nbytes < REUSED_BELOW


def fastest(calls: dict[str, Callable[[], None]], touch: Callable[[], object],
            align: Callable[[], None], slowest: Callable[[list[float]], list[float]],
            default: str, nbytes: int, reused: bool = False) -> tuple[str, str | None]:
    """The path whose ``calls`` entry ran fastest on buffers written before each call, and with
    ``reused`` the one fastest on buffers sent again as they are (else None), timed as ``bench
    collectives --paths [--written]`` times them: in ``ROUNDS`` turns, each path a block of one
    untimed call (its buffers back into the caches: in turns of one call each finds the others'
    there) and ``reps`` timed ones, each after ``touch()`` (which writes the buffers the calls
    send; not when timing them reused) and ``align()`` (a barrier, so that every rank starts it
    together); the median of each path's times, the slowest rank's (``slowest``: collective,
    elementwise over the ranks), so every rank takes the same. ``default`` (the table's) stays
    unless another beats it by ``MARGIN``. Collective: every rank calls it with the same paths, in
    the same order."""
    modes = (True, False) if reused else (True,)
    times: dict[tuple, list[float]] = {(path, w): [] for w in modes for path in calls}
    for written in modes:
        for _ in range(ROUNDS):
            for path, call in calls.items():
                touch()
                call()
                for _ in range(reps(nbytes)):
                    if written:
                        touch()
                    align()
                    start = time.perf_counter()
                    call()
                    times[path, written].append(time.perf_counter() - start)
    medians = dict(zip(times, slowest([statistics.median(t) for t in times.values()]), strict=True))

    def best(written: bool) -> str:
        mine = {path: medians[path, written] for path in calls}
        first = min(mine, key=mine.__getitem__)
        return default if default in mine and mine[first] * (1 + MARGIN) >= mine[default] else first

    return best(True), best(False) if reused else None
