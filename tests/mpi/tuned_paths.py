"""Under mpiexec -n 2: broadcast, allgather and allreduce take the path the group timed, the same on
every rank.

A group whose shared-memory steps are in C times broadcast's, allgather's and (2 ranks) allreduce's
paths at the first call of each size class from ``tuning.MIN_BYTES`` (``comm/mpi/tuning.py``). Here
each is called at sizes around the classes' edges, from each root, with new values each time, and
every result is checked exactly: an allreduce's sum and average against this process's own sum of
the two ranks' values, which every path must match bit for bit. Each rank prints one JSON line:
whether every result was right, the paths it timed (size class -> path), the paths it took per size,
and how long its first call of each class took.
"""

import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from downpour_lib.comm import mpi  # noqa: F401 -- registers "mpi"
from downpour_lib.comm.mpi import tuning
from downpour_lib.comm.mpi.routing import Undecided


def kept(pg, op: str, nbytes: int) -> str | None:
    """The path of the route the group keeps for ``op`` on ``nbytes`` (the whole buffer), if any."""
    return next((route.path for key, route in pg._router.routes.items()
                 if key[0] == op and key[1] == nbytes), None)


def main() -> int:
    dist.init_process_group("mpi", timeout=timedelta(seconds=30))
    rank, n = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    right, first = True, {}
    for numel in (1 << 10, (4 << 10) - 1, 4 << 10, 1 << 14, (1 << 16) + 3, 1 << 18, 1 << 20):
        for call in range(2):
            for root in range(n):
                every = [torch.arange(numel, dtype=torch.float32) + 10 * r + call for r in range(n)]
                t = every[rank].clone()
                start = time.perf_counter()
                dist.broadcast(t, src=root)
                first.setdefault(f"broadcast {t.nbytes}", time.perf_counter() - start)
                right &= torch.equal(t, every[root])
            every = [torch.arange(numel, dtype=torch.int64) * (r + 1) + call for r in range(n)]
            out = torch.full((n * numel,), -1, dtype=torch.int64)
            start = time.perf_counter()
            dist.all_gather_into_tensor(out, every[rank])
            first.setdefault(f"allgather {out.nbytes}", time.perf_counter() - start)
            right &= torch.equal(out, torch.cat(every))
            every = [torch.randn(numel, generator=torch.Generator().manual_seed(7 * r + call))
                     for r in range(n)]
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                t = every[rank].clone()
                start = time.perf_counter()
                dist.all_reduce(t, op=op)
                first.setdefault(f"allreduce {t.nbytes}", time.perf_counter() - start)
                want = every[0] + every[1]
                right &= torch.equal(t, want if op == dist.ReduceOp.SUM else want / 2)
    tuned = {f"{op} {cls}": path for (op, cls), path in pg._router.trials.items()}
    # classes whose written and reused paths differ (made so here, for classes not called above):
    # the second call takes the reused one only where every rank sends the first call's buffer
    # untouched; (op, numel, the two paths, which ranks write their buffer in place between calls,
    # whether each call sends a new tensor)
    decided = {}
    for op, numel, written, reused, writers, new in (
            ("broadcast", 1 << 19, "mpi", "shm", (), False),
            ("broadcast", 1 << 17, "mpi", "shm", (1,), False),
            ("allgather", 1 << 15, "mpi", "shm", (), False),
            ("allgather", 1 << 13, "mpi", "shm", (), True)):
        dtype = torch.float32 if op == "broadcast" else torch.int64
        nbytes = numel * (4 if op == "broadcast" else 8 * n)
        cls = (op, tuning.size_class(nbytes))
        pg._router.trials[cls] = Undecided(written, reused)
        t = torch.arange(numel, dtype=dtype) + rank
        out = torch.full((n * numel,), -1, dtype=dtype)
        for call in range(3):
            if op == "broadcast":
                dist.broadcast(t, src=0)
                right &= torch.equal(t, torch.arange(numel, dtype=dtype))
            else:
                dist.all_gather_into_tensor(out, t)
                right &= torch.equal(out, torch.cat([torch.arange(numel, dtype=dtype) + r + call * new
                                                     for r in range(n)]))
            if rank in writers:
                t.add_(0)  # written in place: the same values, a new version
            if new:
                t = torch.arange(numel, dtype=dtype) + rank + call + 1
        decided[f"{op} {numel}"] = [pg._router.trials[cls], kept(pg, op, nbytes)]
    print(json.dumps({"rank": rank, "right": right, "in_c": pg._shm.in_c, "tuned": tuned,
                      "paths": {f"{key[0]} {key[1]}": route.path
                                for key, route in pg._router.routes.items()
                                if f"{key[0]} {tuning.size_class(key[1])}" in tuned},
                      "decided": decided, "first_s": first}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
