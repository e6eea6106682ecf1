"""Which path a collective's data takes on one node, by operation, size and ranks: measured.

The way MPI libraries choose an algorithm (Open MPI's ``coll_tuned`` decision tables): a table per
operation of the size from which each path wins, one row per number of ranks. The paths:

* ``"nb"``: MPI's nonblocking call waited on with naps, no gate (``data_phase``); cheap for small
  buffers, and a stopped peer only makes the wait time out and name it;
* ``"shm"``: our shared memory (``shm``, ``shm_data``): barriers that spin briefly, then sleep;
* ``"mpi"``: MPI's blocking call after the gate (``liveness.gate``). It wins where Open MPI moves a
  buffer with one copy (CMA) and shared memory takes two. A peer stopped inside the blocking call
  leaves the others spinning until the watchdog's timeout, so an allreduce of up to 256 KB is,
  behind the gate, MPI's nonblocking call waited on with a spin and then naps (``data_phase``). A
  reduce_scatter above 256 KB, an uneven allgather and an allgather across nodes are their
  nonblocking calls spun for about their data time, then napping: as fast, and a stopped peer is
  named.

The rule: each cell takes the path with the lowest p50 over Open MPI's own call, measured on a quiet
machine by ``downpour bench collectives --backends mpi --paths`` in two sittings; where they tie, the
path whose waits sleep; where a nonblocking call wins only on a quiet machine, the gate (on a loaded
one its naps stretch every round). With more ranks than cores shared memory's barriers wait for each
rank to be scheduled, so the rows for 3 and more ranks send small and middle sizes to MPI. Groups
across nodes, and dtypes or reductions shared memory does not take, keep MPI's calls
(``process_group``). The tables as they stand are printed in the guide from this module
(docs/mpi_backend.md, "How a call is routed"); the measurements behind each step are in this
file's git history.
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
