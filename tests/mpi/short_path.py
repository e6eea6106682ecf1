"""Under mpiexec -n 2: synchronous allreduces on the short path give the results of the long one.

``MPIProcessGroup.allreduce`` remembers, after one synchronous allreduce of a contiguous CPU
tensor, whether its path was the C steps over shared memory; the next ones of the same size, dtype
and op skip ``_issue`` (``_allreduce_in_c``). Here every such case is called three times with new
values each time, and each result is checked exactly (small integers, so float sums are exact):
SUM, AVG and PRODUCT of float32, float64, int32 and int64, and MAX, whose path is MPI's. Then a
non-contiguous tensor of a learnt size, an asynchronous call, and a call under torch's profiler,
which must take the long path (the profiler's event is recorded there). Each rank prints one JSON
line per case: whether every result was right, and how many calls took the short path.
"""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.profiler import profile

from downpour_lib.comm import mpi  # noqa: F401 -- registers "mpi"

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
    short = [0]
    long_path = pg._allreduce_in_c

    def counted(*args):
        short[0] += 1
        return long_path(*args)

    pg._allreduce_in_c = counted

    def values(numel: int, dtype: torch.dtype, call: int) -> list[torch.Tensor]:
        base = torch.arange(numel) % 5
        return [(base + r + call).to(dtype) for r in range(n)]

    cases = []
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        for op in OPS:
            if op == "avg" and not dtype.is_floating_point:
                continue
            for numel in (1, 1000, 1 << 16):
                right, short[0] = True, 0
                for call in range(3):
                    every = values(numel, dtype, call)
                    t = every[rank].clone()
                    dist.all_reduce(t, op=OPS[op])
                    right &= torch.equal(t, expected(op, every))
                cases.append({"case": f"{op} {dtype} {numel}", "right": right,
                              "short": short[0]})

    # a learnt size, dtype and op, but not contiguous: the long path stages it
    short[0] = 0
    every = values(2000, torch.float32, 0)
    wide = every[rank].clone()
    dist.all_reduce(wide[::2])
    right = torch.equal(wide[::2], expected("sum", [v[::2] for v in every])) \
        and torch.equal(wide[1::2], every[rank][1::2])
    cases.append({"case": "non-contiguous", "right": right, "short": short[0]})

    # asynchronous: queued to the executor, never the short path
    short[0] = 0
    every = values(1000, torch.float32, 1)
    t = every[rank].clone()
    dist.all_reduce(t, async_op=True).wait()
    cases.append({"case": "async", "right": torch.equal(t, expected("sum", every)),
                  "short": short[0]})

    # under the profiler: the long path, which records the operation's event
    short[0] = 0
    every = values(1000, torch.float32, 2)
    t = every[rank].clone()
    with profile() as prof:
        dist.all_reduce(t)
    names = [e.name for e in prof.events() if e.name.startswith("mpi:")]
    cases.append({"case": "profiled", "right": torch.equal(t, expected("sum", every)),
                  "short": short[0], "events": names})

    for case in cases:
        print(json.dumps({"rank": rank, "shm_in_c": pg._shm.in_c, **case}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
