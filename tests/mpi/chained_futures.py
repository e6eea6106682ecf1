"""Under mpiexec -n N: collectives issued from futures' callbacks, on the mpi backend, against gloo.

torch's PowerSGD hooks wait on a collective inside a future's callback, and the mpi backend completes
its futures on the thread that runs its queued collectives (comm/mpi/work.py). Parts:

* ``then_chain``: a user-level ``fut.then()`` chain whose callbacks issue collectives (asynchronous
  ones they wait for, a synchronous one, one waiting on a work queued behind them), attached before
  and after the first future completes, with collectives queued behind it meanwhile;
* ``powerSGD`` and ``batched_powerSGD``: DDP with torch's own hooks (rank-2 approximation, PowerSGD
  from the second step), trained on gloo and on mpi from the same seed: parameters must be equal on
  every rank and equal to gloo's.

The default group is gloo (the reference); the mpi group is ``new_group(backend="mpi")`` over the
same ranks. Rank 0 prints one JSON line; the exit status is non-zero if any check failed.
"""

import copy
import datetime
import json
import sys
import threading
import time

import torch
import torch.distributed as dist
from checker import Checker
from mpi4py import MPI
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from downpour_lib import runtime

TIMEOUT_S = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0  # the groups' timeout
ONLY = sys.argv[2].split(",") if len(sys.argv) > 2 else None  # run only these parts
STEPS = 6


def then_chain(mpi, check):
    """Callbacks that issue collectives and wait for them, on whatever thread completes the future.

    Each callback that issues a collective is attached right after the work it follows, before
    anything else is issued: where its collective falls among the others then does not depend on
    whether the future completed before the callback was attached (which is a race)."""
    threads = [chain(mpi, check, attach_late) for attach_late in (False, True)]
    return {"callback_threads": threads}


def chain(mpi, check, attach_late):
    """One chain; returns the name of the thread its first callback ran on."""
    n, r = dist.get_world_size(), dist.get_rank()
    a, b, c = torch.full((1000,), float(r)), torch.full((7,), float(r)), torch.zeros(3)
    # 16 MB ahead: the callbacks are attached while ``a``'s allreduce still waits its turn
    ahead = dist.all_reduce(torch.ones(1 << 22), group=mpi, async_op=True)
    fut = dist.all_reduce(a, group=mpi, async_op=True).get_future()
    thread = []

    def nested(f):
        thread.append(threading.current_thread().name)
        # an asynchronous collective waited for inside the callback (PowerSGD's pattern), then a
        # synchronous one
        out = dist.all_reduce(f.value()[0][:7] + b, group=mpi, async_op=True).get_future()
        x = out.wait()[0]
        dist.broadcast(c.add_(x[:3]), group=mpi, group_src=n - 1)
        return x

    if attach_late:
        fut.wait()  # the callbacks run on this thread
    chained = fut.then(nested)
    queued = torch.ones(7)
    behind = dist.all_reduce(queued, group=mpi, async_op=True)  # may queue behind ``a``'s

    def waits_behind(f):
        behind.wait()  # issued after the chain began: on the executor's thread, still queued
        return f.value() + queued

    x = chained.then(waits_behind).wait()
    ahead.wait()
    expected = n * (n - 1) // 2 * (n + 1)
    check.check(f"then chain (attached {'late' if attach_late else 'early'})",
                torch.equal(x, torch.full((7,), float(expected + n)))
                and torch.equal(c, torch.full((3,), float(expected))), f"{x} {c}")
    return thread[0]


def make_model(square):
    """Four layers; ``square``: three, 3364 = 58 x 58 parameters. batched_powerSGD_hook views a
    bucket as a square matrix, resizing it in place where it is not one, which DDP's buckets
    refuse ("Trying to resize storage that is not resizable", on gloo too)."""
    torch.manual_seed(0)
    if square:
        return torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.ReLU(),
                                   torch.nn.Linear(48, 48), torch.nn.ReLU(), torch.nn.Linear(48, 4))
    return torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.ReLU(), torch.nn.Linear(48, 48),
                               torch.nn.ReLU(), torch.nn.Linear(48, 40), torch.nn.ReLU(),
                               torch.nn.Linear(40, 4))


def train(group, hook, bucket_cap_mb, square):
    """STEPS of SGD on DDP with ``hook`` over ``group``; this rank's data, the same on any backend."""
    model = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(make_model(square)),
                                                      process_group=group,
                                                      bucket_cap_mb=bucket_cap_mb)
    state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=2,
                                   start_powerSGD_iter=2, random_seed=0)
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(STEPS):
        x, y = torch.randn(32, 16, generator=gen), torch.randint(0, 4, (32,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def waited(hook):
    """``hook``, waited for before it returns. gloo runs a future's callbacks on its worker thread,
    so a PowerSGD callback's collectives race the next bucket's (gloo's own run with several buckets
    fails: "Received data size doesn't match expected size"); waited for, they come first, which
    is the order the mpi backend gives them (comm/mpi/work.py)."""
    def run(state, bucket):
        done = torch.futures.Future()
        done.set_result(hook(state, bucket).wait())
        return done
    return run


def batch_of_one(orthogonalize):
    """torch 2.14's batched_powerSGD_hook hands ``_orthogonalize`` one 2-D matrix, which it refuses
    (an AssertionError at the first compressed step, on every backend, gloo included): here it
    gets a batch of one, as the hook means (both backends alike)."""
    def run(matrices, epsilon=0):
        return orthogonalize(matrices.unsqueeze(0) if matrices.dim() == 2 else matrices, epsilon)
    return run


def ddp_hook(name, hook, bucket_cap_mb, gloo, mpi, check):
    start = time.monotonic()
    several = bucket_cap_mb < 1  # this model is about 0.03 MB
    square = hook is powersgd.batched_powerSGD_hook
    reference = train(gloo, waited(hook) if several else hook, bucket_cap_mb, square)
    gloo_s = time.monotonic() - start
    start = time.monotonic()
    params = train(mpi, hook, bucket_cap_mb, square)
    mpi_s = time.monotonic() - start
    flat = torch.cat([p.reshape(-1) for p in params])
    everyone = MPI.COMM_WORLD.allgather(flat.numpy())
    same_everywhere = all((torch.from_numpy(f) == flat).all().item() for f in everyone)
    diff = max(float((p - q).abs().max()) for p, q in zip(params, reference, strict=True))
    with torch.no_grad():
        moved = max(float((p - q).abs().max())
                    for p, q in zip(params, make_model(square).parameters(), strict=True))
    check.check(f"{name}: parameters equal on every rank", same_everywhere)
    check.check(f"{name}: parameters equal gloo's", diff < 1e-5, f"max diff {diff}")
    check.check(f"{name}: trained", moved > 1e-3, f"moved {moved}")
    return {"max_diff_vs_gloo": diff, "moved": moved, "gloo_s": round(gloo_s, 2),
            "mpi_s": round(mpi_s, 2)}


def main() -> int:
    ctx = runtime.init(backend="gloo", device="cpu", timeout_s=TIMEOUT_S)
    gloo = dist.group.WORLD
    mpi = dist.new_group(backend="mpi", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    assert dist.get_backend(mpi) == "mpi"
    check = Checker()
    powersgd._orthogonalize = batch_of_one(powersgd._orthogonalize)
    parts = {}
    for part, fn in [
            ("then_chain", lambda: then_chain(mpi, check)),
            # one bucket, as gloo runs it; then several: later buckets' hooks are issued while
            # earlier ones' callbacks run
            ("powerSGD", lambda: ddp_hook("powerSGD", powersgd.powerSGD_hook, 25, gloo, mpi,
                                          check)),
            ("powerSGD buckets", lambda: ddp_hook("powerSGD buckets", powersgd.powerSGD_hook,
                                                  0.004, gloo, mpi, check)),
            ("batched_powerSGD", lambda: ddp_hook("batched_powerSGD",
                                                  powersgd.batched_powerSGD_hook, 25, gloo, mpi,
                                                  check)),
            ]:
        if ONLY is not None and part not in ONLY:
            continue
        before = check.cases
        extra = fn()
        parts[part] = {"cases": check.cases - before, **(extra or {})}
    dist.destroy_process_group(mpi)
    runtime.shutdown()
    failures = MPI.COMM_WORLD.gather(check.failures, root=0)
    cases = MPI.COMM_WORLD.reduce(check.cases, root=0)
    if ctx.rank == 0:
        flat = [f for per_rank in failures for f in per_rank]
        print(json.dumps({"world_size": ctx.world_size, "cases": cases, "parts": parts,
                          "failures": flat[:30], "failure_count": len(flat)}), flush=True)
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
