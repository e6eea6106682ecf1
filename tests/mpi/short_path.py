"""Under mpiexec -n 2: synchronous collectives on the short path give the results of the long one.

After one synchronous allreduce of a contiguous CPU tensor, ``MPIProcessGroup`` remembers whether
its path was the C steps over shared memory; the next ones of the same size, dtype and op skip
``_issue`` (the short paths: ``comm/mpi/routing.Route.short``). Broadcast and all_gather_into_tensor skip
it where the last call of their size went to shared memory (which, from 16 KB, the group timed:
``tuning``, as it times a 2-rank allreduce's; each case says which path its size took). Here every
case is called three times with new values each time, and each result is checked exactly (small
integers, so float sums are exact): SUM, AVG and PRODUCT of float32, float64, int32 and int64, and
MAX, whose path is MPI's; broadcast from each root and all_gather_into_tensor at 4 KB and 1 MB. Then
a non-contiguous tensor of a learnt size, an all_gather_into_tensor whose input is its output's
block, an asynchronous call, and a call under torch's profiler, which must take the long path (the
profiler's event is recorded there). Then a synchronous call made directly, which returns no work,
and a wait past the spin, which a probe of the waiting rank must see, in shared memory and in the C
data phase's MPI call. Each rank prints one JSON line per case: whether every result was right, and
how many calls took the short path (did not reach ``_issue``)."""

import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.profiler import profile

from downpour_lib.comm import mpi  # noqa: F401 -- registers "mpi"
from downpour_lib.comm.mpi import native
from downpour_lib.comm.mpi.liveness import WATCHDOG
from downpour_lib.comm.mpi.types import kind

OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
       "max": dist.ReduceOp.MAX}


def expected(op: str, values: list[torch.Tensor]) -> torch.Tensor:
    if op == "sum":
        return sum(values[1:], values[0])
    if op == "avg":
        return sum(values[1:], values[0]) / len(values)
    if op == "product":
        return torch.stack(values).prod(0).to(values[0].dtype)
    return torch.stack(values).amax(0)


def main() -> int:
    dist.init_process_group("mpi", timeout=timedelta(seconds=30))
    rank, n = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    issued = [0]
    issue = pg._issue

    def counted(*args, **kwargs):
        issued[0] += 1
        return issue(*args, **kwargs)

    pg._issue = counted

    def values(numel: int, dtype: torch.dtype, call: int) -> list[torch.Tensor]:
        base = torch.arange(numel) % 5
        return [(base + r + call).to(dtype) for r in range(n)]

    cases = []
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        for op in OPS:
            if op == "avg" and not dtype.is_floating_point:
                continue
            for numel in (1, 1000, 1 << 16):
                right, issued[0] = True, 0
                for call in range(3):
                    every = values(numel, dtype, call)
                    t = every[rank].clone()
                    dist.all_reduce(t, op=OPS[op])
                    right &= torch.equal(t, expected(op, every))
                key = ("allreduce", t.nbytes, dtype, kind(OPS[op]), True)
                cases.append({"case": f"{op} {dtype} {numel}", "right": right,
                              "short": 3 - issued[0], "path": pg._router.routes[key].path})

    for numel in (1 << 10, 1 << 18):
        for root in range(n):
            right, issued[0] = True, 0
            for call in range(3):
                every = values(numel, torch.float32, call)
                t = every[rank].clone()
                dist.broadcast(t, src=root)
                right &= torch.equal(t, every[root])
                key = ("broadcast", t.nbytes, t.dtype, root, True)
                if call == 0:  # an undecided class (``routing.Undecided``) keeps its route at call 2
                    kept = key in pg._router.routes
            cases.append({"case": f"broadcast from {root} {numel}", "right": right, "kept": kept,
                          "short": 3 - issued[0], "path": pg._router.routes[key].path})
        right, issued[0] = True, 0
        for call in range(3):
            every = values(numel, torch.int32, call)
            out = torch.full((n * numel,), -1, dtype=torch.int32)
            dist.all_gather_into_tensor(out, every[rank])
            right &= torch.equal(out, torch.cat(every))
            key = ("allgather", out.nbytes, out.dtype, every[rank].nbytes, True)
            if call == 0:
                kept = key in pg._router.routes
        cases.append({"case": f"all_gather_into_tensor {numel}", "right": right, "kept": kept,
                      "short": 3 - issued[0], "path": pg._router.routes[key].path})

    # a learnt size and dtype whose input is this rank's block of the output (an in-place gather,
    # as FSDP makes): the buffers overlap, so the long path, which copies the input first
    issued[0] = 0
    every = values(1 << 10, torch.int32, 3)
    out = torch.full((n << 10,), -1, dtype=torch.int32)
    mine = out[rank << 10:(rank + 1) << 10]
    mine.copy_(every[rank])
    dist.all_gather_into_tensor(out, mine)
    cases.append({"case": "overlapping", "right": torch.equal(out, torch.cat(every)),
                  "short": 1 - issued[0]})

    # a learnt size, dtype and op, but not contiguous: the long path stages it
    issued[0] = 0
    every = values(2000, torch.float32, 0)
    wide = every[rank].clone()
    dist.all_reduce(wide[::2])
    right = torch.equal(wide[::2], expected("sum", [v[::2] for v in every])) \
        and torch.equal(wide[1::2], every[rank][1::2])
    cases.append({"case": "non-contiguous", "right": right, "short": 1 - issued[0]})

    # asynchronous: queued to the executor, never the short path
    issued[0] = 0
    every = values(1000, torch.float32, 1)
    t = every[rank].clone()
    dist.all_reduce(t, async_op=True).wait()
    cases.append({"case": "async", "right": torch.equal(t, expected("sum", every)),
                  "short": 1 - issued[0]})

    # under the profiler: the long path, which records the operation's event
    issued[0] = 0
    every = values(1000, torch.float32, 2)
    t = every[rank].clone()
    with profile() as prof:
        dist.all_reduce(t)
    names = [e.name for e in prof.events() if e.name.startswith("mpi:")]
    cases.append({"case": "profiled", "right": torch.equal(t, expected("sum", every)),
                  "short": 1 - issued[0], "events": names})

    # called directly, synchronous: the short path returns no work, as torch's backends that
    # synchronize in C++ do (dist.all_reduce takes None)
    issued[0] = 0
    every = values(1000, torch.float32, 3)
    t = every[rank].clone()
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    work = pg.allreduce([t], opts)
    cases.append({"case": "direct", "right": work is None and torch.equal(t, expected("sum", every)),
                  "short": 1 - issued[0]})

    # rank 0 waits on the short path past the spin while rank 1 probes it: its answer says where
    # (the C steps note the wait themselves), and the note is gone once it returns; in shared
    # memory (native_shm.c) and in the C data phase's MPI call (MAX, not shared memory's:
    # native_calls.c)
    for name, op, call in (("waited", "sum", 4), ("waited in MPI", "max", 5)):
        issued[0] = 0
        every = values(1000, torch.float32, call)
        t = every[rank].clone()
        answer = None
        if rank == 1:
            time.sleep(0.5)
            answer = WATCHDOG.probe([0])[0]
        dist.all_reduce(t, op=OPS[op])
        cases.append({"case": name, "right": torch.equal(t, expected(op, every)),
                      "short": 1 - issued[0], "answer": answer, "notes": native.waiting()})

    for case in cases:
        print(json.dumps({"rank": rank, "shm_in_c": pg._shm.in_c, **case}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
