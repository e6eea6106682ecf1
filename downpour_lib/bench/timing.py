"""Timing shared by the collective benchmarks (``bench collectives`` and its ``--breakdown``):
buffer sizes per operation, barriers through MPI where there is one, and the slowest rank's times."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from ..comm import Communicator, runtime


def buffer_size(op: str, nbytes: int, n: int, dtype: torch.dtype) -> tuple[int, int]:
    """(elements per rank's buffer, the bytes a row reports) for ``op`` asked at ``nbytes``: whole
    elements, and for allgather, reduce_scatter and alltoall n equal parts of the whole buffer."""
    elem = torch.empty(0, dtype=dtype).element_size()
    if op in ("allgather", "reduce_scatter", "alltoall"):
        count = max(1, nbytes // (elem * n))
        return count, count * elem * n
    count = max(1, nbytes // elem)
    return count, count * elem


class Sync:
    """Barriers and cross-rank reductions of timings: through MPI when there is one (a barrier's exit
    skew there is microseconds), else through the gloo default group."""

    def __init__(self, world: Communicator) -> None:
        self.comm = runtime.launch_mpi_world()
        self.world = world

    def barrier(self) -> None:
        if self.comm is not None:
            self.comm.Barrier()
        else:
            self.world.barrier()

    def slowest(self, times: list[float]) -> list[float]:
        return self.world.allreduce(torch.tensor(times, dtype=torch.float64), op="max").tolist()

    def agree(self, value: int) -> int:
        return int(self.world.broadcast(torch.tensor([value]), root=0))


TURNS = 10  # how many turns ``measure_paired`` splits each call's repetitions into


def measure(run: Callable[[], object], sync: Sync, args: argparse.Namespace,
            touch: Callable[[], object] | None = None) -> list[float]:
    """Per-repetition times (the slowest rank's), after warm-up; rank 0 picks the repetitions."""
    return measure_paired([run], sync, args, touch)[0]


def measure_paired(runs: list[Callable[[], object]], sync: Sync, args: argparse.Namespace,
                   touch: Callable[[], object] | None = None) -> list[list[float]]:
    """``measure`` for several calls at once, taking turns: each sees the machine as the others do
    (a ratio of two p50s measured one after the other carries the drift of a shared machine
    between them; taken in turns it does not). A turn is ``1 / TURNS`` of the repetitions after
    one untimed call, so that each call finds its own buffers in the caches as ``measure`` does
    (in turns of one repetition the other call had swept them out: at 16 MB both ran about twice
    as long as alone). With ``args.written``, ``touch`` (which writes every buffer the calls
    send) runs before every call, timed or not (``--written``): a group that chooses its path by
    whether its second call sends the buffer unchanged (``comm/mpi/routing.Undecided``) saw two
    warm-up calls without a write between them, and took the reused buffers' path for every
    written repetition after (1 MB broadcast 1.14x Open MPI's own against 0.90 written). Times per
    call."""
    written = getattr(args, "written", False) and touch is not None

    def untimed(run: Callable[[], object]) -> None:
        if written:
            touch()
        run()

    for run in runs:
        for _ in range(args.warmup):
            untimed(run)
    sync.barrier()
    start = time.perf_counter()
    for run in runs:
        untimed(run)
    estimate = sync.slowest([time.perf_counter() - start])[0] / len(runs)
    reps = sync.agree(min(args.max_reps, max(args.min_reps, int(args.min_time / max(estimate, 1e-7)))))
    per_turn = -(-reps // TURNS) if len(runs) > 1 else reps
    times: list[list[float]] = [[] for _ in runs]
    while len(times[0]) < reps:
        for run, mine in zip(runs, times, strict=True):
            if len(runs) > 1:
                untimed(run)  # back into the caches
            for _ in range(min(per_turn, reps - len(mine))):
                if written:
                    touch()
                sync.barrier()
                start = time.perf_counter()
                run()
                mine.append(time.perf_counter() - start)
    slowest = sync.slowest([t for mine in times for t in mine])
    return [slowest[i * reps:(i + 1) * reps] for i in range(len(runs))]
