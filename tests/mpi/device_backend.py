"""Under mpiexec -n N: the torch APIs that look a backend up by device, on the mpi backend.

The default group is mpi (``init_process_group("mpi")`` through runtime.init); from N = 3 on, an
mpi subgroup over ranks 1..N-1 too (group ranks differ from global ones). Parts:

* ``devices``: the group has a backend for cpu and cuda, torch's lookups find it, and an operation
  reached through it is the group's;
* ``batch_isend_irecv``: a ring exchange in both directions, two tagged messages per pair and
  direction, several dtypes, the ops listed in an order that would deadlock one by one;
* ``monitored_barrier``: passes when every rank comes; with the last rank (and, for
  ``wait_all_ranks``, the last two) never arriving, every rank that came raises an error naming
  them, within the barrier's timeout and far inside the group's.

Rank 0 prints one JSON line; the exit status is non-zero if any check failed.
"""

import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from checker import Checker
from mpi4py import MPI

from downpour_lib import runtime
from downpour_lib.comm.mpi.device import DeviceBackend

GROUP_TIMEOUT_S = 120.0
BARRIER_TIMEOUT_S = 3.0


def devices(group, check):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    backend = group._get_backend(cpu)
    check.check("backend for cpu and cuda", set(group._device_types) == {cpu, cuda}
                and isinstance(backend, DeviceBackend) and group._get_backend(cuda) is backend
                and backend.name() == "mpi", f"{group._device_types} {backend}")
    check.check("object collectives on cpu", dist.distributed_c10d._get_object_coll_device(group)
                == "cpu")
    t = torch.full((5,), float(dist.get_rank(group) + 1))
    backend.allreduce([t], dist.AllreduceOptions()).wait()  # the group's operation, reached by device
    n = dist.get_world_size(group)
    check.check("allreduce through the device's backend", torch.equal(t, torch.full((5,), n * (n + 1)
                                                                                    / 2.0)), f"{t}")
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": dist.get_rank(group)}, group=group)
    check.check("all_gather_object", objects == [{"rank": r} for r in range(n)], f"{objects}")


def batch(group, check):
    """Each rank sends to both neighbours and receives from both, twice per pair and direction
    (tags 3 and 5, different sizes), in one batch whose order sends everything first."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    right, left = (r + 1) % n, (r - 1) % n
    ops, expected = [], []
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        for peer in (right, left):
            for tag, size in ((3, 7), (5, 1000)):
                ops.append(dist.P2POp(dist.isend, value(r, peer, tag, size, dtype), group=group,
                                      group_peer=peer, tag=tag))
        for peer in (left, right):
            for tag, size in ((3, 7), (5, 1000)):
                out = torch.zeros(size, dtype=dtype)
                ops.append(dist.P2POp(dist.irecv, out, group=group, group_peer=peer, tag=tag))
                expected.append((out, value(peer, r, tag, size, dtype)))
    works = dist.batch_isend_irecv(ops)
    for w in works:
        w.wait()
    check.check("batch_isend_irecv", len(works) == len(ops)
                and all(torch.equal(out, want) for out, want in expected))


def value(src, dst, tag, size, dtype):
    return (torch.arange(size) % 50 + 100 * src + 10 * dst + tag).to(dtype)


def monitored(group, check):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    for wait_all in (False, True):
        dist.monitored_barrier(group, timeout=timedelta(seconds=30), wait_all_ranks=wait_all)
    check.check("monitored_barrier, every rank there", True)
    timings = {}
    for wait_all in (False, True):
        absent = [n - 1] if not wait_all or n < 4 else [n - 2, n - 1]
        if r not in absent:
            start = time.monotonic()
            try:
                dist.monitored_barrier(group, timeout=timedelta(seconds=BARRIER_TIMEOUT_S),
                                       wait_all_ranks=wait_all)
                error = ""
            except RuntimeError as exc:
                error = str(exc)
            elapsed = time.monotonic() - start
            timings[f"wait_all={wait_all}"] = round(elapsed, 2)
            names = ("Rank " if len(absent) == 1 else "Ranks ") + ", ".join(map(str, absent))
            ms = int(BARRIER_TIMEOUT_S * 1000)
            if r == 0:
                want = f"[Rank 0]: {names} failed to pass monitoredBarrier in {ms} ms"
            else:
                want = (f"Rank {r} successfully reached monitoredBarrier, but rank 0 found that "
                        f"{names.lower()} failed to pass monitoredBarrier in {ms} ms")
            check.check(f"monitored_barrier names {absent} (wait_all_ranks={wait_all})",
                        error == want, f"{error!r}")
            check.check(f"monitored_barrier ends within the group's timeout (wait_all_ranks="
                        f"{wait_all})", elapsed < GROUP_TIMEOUT_S / 2, f"{elapsed:.1f} s")
        dist.barrier(group)  # the absent ranks come back; nothing of theirs was left in flight
    dist.monitored_barrier(group, timeout=timedelta(seconds=30))  # and a later one passes
    check.check("monitored_barrier after failed ones", True)
    return timings


def main() -> int:
    ctx = runtime.init(backend="mpi", device="cpu", timeout_s=GROUP_TIMEOUT_S)
    assert dist.get_backend() == "mpi"
    n = ctx.world_size
    groups = {"world": dist.group.WORLD}
    sub = dist.new_group(list(range(1, n)), backend="mpi") if n > 2 else None
    if sub is not None and ctx.rank > 0:
        groups["subgroup"] = sub
    check = Checker()
    parts = {}
    for name, group in groups.items():
        for part, fn in [("devices", devices), ("batch_isend_irecv", batch),
                         ("monitored_barrier", monitored)]:
            before = check.cases
            extra = fn(group, check)
            parts[f"{name} {part}"] = {"cases": check.cases - before, **(extra or {})}
    if sub is not None:
        dist.destroy_process_group(sub)
    runtime.shutdown()
    failures = MPI.COMM_WORLD.gather(check.failures, root=0)
    cases = MPI.COMM_WORLD.reduce(check.cases, root=0)
    every = MPI.COMM_WORLD.gather(parts, root=0)
    if ctx.rank == 0:
        flat = [f for per_rank in failures for f in per_rank]
        print(json.dumps({"world_size": n, "cases": cases, "parts": parts,
                          "subgroup": every[1].get("subgroup monitored_barrier") if n > 2 else None,
                          "failures": flat[:30], "failure_count": len(flat)}), flush=True)
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
