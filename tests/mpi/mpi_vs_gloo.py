"""Under mpiexec -n N: every operation of the mpi backend gives gloo's results, and DDP on it gloo's.

The default group is gloo (runtime.init); beside it, new_group(backend="mpi") over the same ranks, and
a gloo and an mpi subgroup over ranks 1..N-1 (so group ranks differ from global ranks). Each case runs
the same operation on the same inputs (seeded by case and rank) in a gloo group and in its mpi twin
and compares this rank's outputs bit for bit (inputs are small integers, so every dtype sums exactly).
Then point-to-point, async work handles, non-contiguous tensors, refusals, and DDP. Rank 0 prints one
JSON summary line; the exit status is non-zero if any rank saw a difference.

``--shm-min-bytes B`` sets the size from which allreduces take the shared-memory path (comm/mpi/shm.py;
16 KB by default): low, small and odd sizes go through it too; very high, every allreduce goes through
MPI's own. all_reduce also runs on 300001 elements (more than one chunk per rank for 8-byte dtypes).
``--python-data-phase`` keeps MPI's calls in Python (``DOWNPOUR_MPI_NATIVE=0``), the path of a
machine where the C data phase (comm/mpi/native.py) cannot be built; the summary says which ran.
"""

import copy
import json
import os
import sys

if "--shm-min-bytes" in sys.argv:  # before downpour_lib reads it
    os.environ["DOWNPOUR_MPI_SHM_MIN_BYTES"] = sys.argv[sys.argv.index("--shm-min-bytes") + 1]
if "--python-data-phase" in sys.argv:
    os.environ["DOWNPOUR_MPI_NATIVE"] = "0"

import torch
import torch.distributed as dist
from checker import Checker
from mpi4py import MPI

from downpour_lib import runtime
from downpour_lib.comm.mpi import native, paths, use_world
from downpour_lib.comm.mpi.process_group import MPIProcessGroup

R = dist.ReduceOp
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32,
          torch.int64, torch.uint8, torch.bool]
SIZES = [0, 1, 7, 1000, 65537]
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def make(dtype, numel, seed, small=False):
    """Integer-valued data: sums of N ranks stay exact even in bfloat16."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    lo = 0 if dtype == torch.uint8 else (-2 if small else -8)
    return torch.randint(lo, 3 if small else 8, (numel,), generator=g).to(dtype)


def grank(g):
    return dist.get_rank(g)


def gsize(g):
    return dist.get_world_size(g)


def seed_of(case, g, i=0):
    return case * 1000 + grank(g) * 10 + i


def all_reduce(op):
    def run(g, dt, k, case, async_op=False):
        t = make(dt, k, seed_of(case, g), small=op == R.PRODUCT)
        work = dist.all_reduce(t, op=op, group=g, async_op=async_op)
        if async_op:
            work.wait()
        return [t]
    return run


def all_reduce_coalesced(g, dt, k, case, async_op=False):
    ts = [make(dt, k + i, seed_of(case, g, i)) for i in range(3)]
    dist.all_reduce_coalesced(ts, group=g)
    return ts


def broadcast(g, dt, k, case, async_op=False):
    t = make(dt, k, seed_of(case, g))
    work = dist.broadcast(t, group=g, group_src=gsize(g) - 1, async_op=async_op)
    if async_op:
        work.wait()
    return [t]


def reduce(op):
    def run(g, dt, k, case, async_op=False):
        t = make(dt, k, seed_of(case, g), small=op == R.PRODUCT)
        root = 1 % gsize(g)
        dist.reduce(t, group=g, group_dst=root, op=op)
        return [t] if grank(g) == root else []
    return run


def all_gather(g, dt, k, case, async_op=False):
    outs = [torch.full((k,), 3).to(dt) for _ in range(gsize(g))]
    dist.all_gather(outs, make(dt, k, seed_of(case, g)), group=g)
    return outs


def all_gather_into_tensor(g, dt, k, case, async_op=False):
    out = torch.zeros(k * gsize(g), dtype=dt)
    work = dist.all_gather_single(out, make(dt, k, seed_of(case, g)), group=g, async_op=async_op)
    if async_op:
        work.wait()
    return [out]


def gather(g, dt, k, case, async_op=False):
    outs = [torch.zeros(k, dtype=dt) for _ in range(gsize(g))] if grank(g) == 0 else None
    work = dist.gather(make(dt, k, seed_of(case, g)), outs, group=g, group_dst=0, async_op=async_op)
    if async_op:
        work.wait()
    return outs or []


def scatter(g, dt, k, case, async_op=False):
    root = gsize(g) - 1
    ins = [make(dt, k, seed_of(case, g, i)) for i in range(gsize(g))] if grank(g) == root else None
    out = torch.zeros(k, dtype=dt)
    work = dist.scatter(out, ins, group=g, group_src=root, async_op=async_op)
    if async_op:
        work.wait()
    return [out]


def reduce_scatter_tensor(op):
    def run(g, dt, k, case, async_op=False):
        out = torch.zeros(k, dtype=dt)
        inp = make(dt, k * gsize(g), seed_of(case, g))
        work = dist.reduce_scatter_single(out, inp, op=op, group=g, async_op=async_op)
        if async_op:
            work.wait()
        return [out]
    return run


def reduce_scatter_list(g, dt, k, case, async_op=False):
    out = torch.zeros(k, dtype=dt)
    dist.reduce_scatter(out, [make(dt, k, seed_of(case, g, i)) for i in range(gsize(g))], group=g)
    return [out]


def all_to_all_single(g, dt, k, case, async_op=False):
    inp = make(dt, k * gsize(g), seed_of(case, g))
    out = torch.zeros(k * gsize(g), dtype=dt)
    dist.all_to_all_single(out, inp, group=g)
    return [out]


def all_to_all_uneven(g, dt, k, case, async_op=False):
    """Rank i sends rows(i, j) rows of 2 elements to rank j."""
    n, me = gsize(g), grank(g)
    rows = lambda i, j: (i + 2 * j + k) % 3  # noqa: E731
    send = [rows(me, j) for j in range(n)]
    recv = [rows(i, me) for i in range(n)]
    inp = make(dt, 2 * sum(send), seed_of(case, g)).view(-1, 2)
    out = torch.zeros(sum(recv), 2, dtype=dt)
    dist.all_to_all_single(out, inp, recv, send, group=g)
    return [out]


def all_to_all_list(g, dt, k, case, async_op=False):
    outs = [torch.zeros(k, dtype=dt) for _ in range(gsize(g))]
    dist.all_to_all(outs, [make(dt, k, seed_of(case, g, i)) for i in range(gsize(g))], group=g)
    return outs


def barrier(g, dt, k, case, async_op=False):
    dist.barrier(group=g)
    return []


OPS = {f"all_reduce {op}": all_reduce(getattr(R, op))
       for op in ["SUM", "AVG", "MIN", "MAX", "PRODUCT", "BAND", "BOR", "BXOR"]}
OPS.update({"all_reduce_coalesced": all_reduce_coalesced, "broadcast": broadcast,
            "reduce SUM": reduce(R.SUM), "reduce MAX": reduce(R.MAX),
            "reduce AVG": reduce(R.AVG), "all_gather": all_gather,
            "all_gather_into_tensor": all_gather_into_tensor, "gather": gather, "scatter": scatter,
            "reduce_scatter_tensor SUM": reduce_scatter_tensor(R.SUM),
            "reduce_scatter_tensor AVG": reduce_scatter_tensor(R.AVG),
            "reduce_scatter_tensor MIN": reduce_scatter_tensor(R.MIN),
            "reduce_scatter": reduce_scatter_list, "all_to_all_single": all_to_all_single,
            "all_to_all_single uneven": all_to_all_uneven, "all_to_all": all_to_all_list,
            "barrier": barrier})
ASYNC = ["all_reduce SUM", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor SUM", "gather",
         "scatter"]


def refused(op_name, dtype):
    """Combinations both backends refuse (checked below to raise on mpi with a clear message)."""
    bitwise = op_name.endswith(("BAND", "BOR", "BXOR"))
    average = op_name.endswith("AVG")
    return (bitwise and dtype in FLOATS) or (average and dtype not in FLOATS)


def same(a, b):
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
                                    for x, y in zip(a, b, strict=True))


def collectives(groups, check, case=0):
    for gname, (gloo, mpi) in groups.items():
        if gloo == dist.GroupMember.NON_GROUP_MEMBER:
            continue
        for op_name, op in OPS.items():
            for dt in DTYPES:
                if refused(op_name, dt):
                    continue
                for k in SIZES + ([300001] if op_name.startswith("all_reduce") else []):
                    case += 1
                    want, got = op(gloo, dt, k, case), op(mpi, dt, k, case)
                    check.check(f"{gname} {op_name} {dt} n={k}", same(want, got))
                    if op_name in ASYNC and k in (7, 65537):
                        got = op(mpi, dt, k, case, async_op=True)
                        check.check(f"{gname} {op_name} {dt} n={k} async", same(want, got))
    return case


# the ops of each row of comm/mpi/paths.py's table, and whether its bytes are the whole buffer of
# n parts (allgather's output, reduce_scatter's input)
PATH_OPS = {"allreduce": ("all_reduce SUM", False), "broadcast": ("broadcast", False),
            "allgather": ("all_gather_into_tensor", True),
            "reduce_scatter": ("reduce_scatter_tensor SUM", True)}


def path_thresholds(gloo, mpi, check):
    """At, just below and just above every size where paths.choose switches path, each op
    synchronous and asynchronous equals gloo's result."""
    n, cases, in_c = gsize(mpi), 0, native.load() is not None
    for name, (op_name, whole) in PATH_OPS.items():
        steps = next(steps for most, steps in paths.table(in_c)[name] if n <= most)
        for dt in (torch.float32, torch.int64):
            elem = torch.empty(0, dtype=dt).element_size()
            for start, _ in steps:
                for nbytes in (start - elem, start, start + elem):
                    k = max(1, -(-nbytes // (elem * n)) if whole else -(-nbytes // elem))
                    cases += 1
                    want = OPS[op_name](gloo, dt, k, 50000 + cases)
                    check.check(f"{op_name} {dt} at {paths.choose(name, k * elem, n, in_c)} "
                                f"threshold {start} B: {k} elements",
                                same(want, OPS[op_name](mpi, dt, k, 50000 + cases)))
                    check.check(f"{op_name} {dt} {k} elements async",
                                same(want, OPS[op_name](mpi, dt, k, 50000 + cases, async_op=True)))
    return {"sizes": cases}


def point_to_point(gloo, mpi, check):
    n, me = dist.get_world_size(), dist.get_rank()
    for dt in DTYPES:
        for k in (0, 7, 65537):
            results = []
            for g in (gloo, mpi):
                # a ring of isend/irecv
                out = torch.zeros(k, dtype=dt)
                reqs = [dist.isend(make(dt, k, 7 * me + k), (me + 1) % n, group=g, tag=5),
                        dist.irecv(out, (me - 1) % n, group=g, tag=5)]
                for r in reqs:
                    r.wait()
                # every rank sends to rank 0, which receives from any source
                got = {}
                if me == 0:
                    for _ in range(n - 1):
                        buf = torch.zeros(k + 1, dtype=dt)
                        src = dist.recv(buf, group=g, tag=9)
                        got[src] = buf
                else:
                    payload = torch.cat([torch.full((1,), me).to(dt), make(dt, k, 11 * me)])
                    dist.send(payload, 0, group=g, tag=9)
                results.append((out, got))
            (out_g, got_g), (out_m, got_m) = results
            check.check(f"p2p ring {dt} n={k}", torch.equal(out_g, out_m))
            if me == 0:
                check.check(f"recv any source {dt} n={k} sources", sorted(got_m) == list(range(1, n)))
                ok = all(torch.equal(got_m[s], got_g[s]) for s in got_m)
                if dt != torch.bool:  # the first element names the sender
                    ok = ok and all(int(got_m[s][0]) == s for s in got_m)
                check.check(f"recv any source {dt} n={k} payload", ok)


def async_handles(mpi, check):
    """Several queued operations complete in issue order; futures carry the tensors."""
    n = dist.get_world_size()
    ts = [torch.full((1000,), float(i)) for i in range(5)]
    works = [dist.all_reduce(t, group=mpi, async_op=True) for t in ts]
    tail = torch.ones(3)
    dist.all_reduce(tail, group=mpi)  # synchronous: runs after the queued ones
    for w in reversed(works):
        w.wait()
    check.check("async in order", all(torch.all(t == i * n) for i, t in enumerate(ts)) and
                torch.all(tail == n))
    t = torch.ones(10)
    fut = dist.all_reduce(t, group=mpi, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    check.check("async future", torch.all(fut.wait() == 2 * n) and torch.all(t == n))
    check.check("async completed", dist.all_reduce(torch.ones(1), group=mpi, async_op=True).wait())


def non_contiguous(gloo, mpi, check):
    me = dist.get_rank()
    for dt in (torch.float32, torch.bfloat16, torch.int64):
        base = make(dt, 6 * 8, 100 + me).view(6, 8)
        want = base.t().contiguous()
        dist.all_reduce(want, group=gloo)
        got = base.clone()
        view = got.t()
        dist.all_reduce(view, group=mpi)
        check.check(f"noncontiguous all_reduce {dt}", torch.equal(view, want))
        dst = torch.zeros(6, 16, dtype=dt)
        strided = dst[:, ::2]
        src = make(dt, 48, 200).view(6, 8)
        if me == 0:
            strided.copy_(src)
        dist.broadcast(strided, 0, group=mpi)
        check.check(f"noncontiguous broadcast {dt}", torch.equal(dst[:, ::2], src) and
                    not dst[:, 1::2].any())
        outs = [torch.zeros(2, 8, dtype=dt).t() for _ in range(dist.get_world_size())]
        dist.all_gather(outs, base[:2].t(), group=mpi)
        refs = [torch.zeros(8, 2, dtype=dt) for _ in range(dist.get_world_size())]
        dist.all_gather(refs, base[:2].t().contiguous(), group=gloo)
        check.check(f"noncontiguous all_gather {dt}",
                    all(torch.equal(o, r) for o, r in zip(outs, refs, strict=True)))
        tiled_all_gather(gloo, mpi, check, dt)


def tiled_all_gather(gloo, mpi, check, dt):
    """all_gather into outputs that lie back to back in one buffer (gathered straight into it),
    out of order (through a scratch buffer), and with this rank's output as its input."""
    me, n = dist.get_rank(), dist.get_world_size()
    mine = make(dt, 5, 300 + me)
    refs = [torch.zeros(5, dtype=dt) for _ in range(n)]
    dist.all_gather(refs, mine, group=gloo)
    whole = torch.zeros(n * 5, dtype=dt)
    dist.all_gather(list(whole.chunk(n)), mine, group=mpi)
    check.check(f"tiled all_gather {dt}", torch.equal(whole, torch.cat(refs)))
    backwards = torch.zeros(n, 5, dtype=dt)
    dist.all_gather(list(backwards.unbind(0))[::-1], mine, group=mpi)
    check.check(f"backwards all_gather {dt}", torch.equal(backwards.flip(0).reshape(-1),
                                                          torch.cat(refs)))
    inplace = torch.zeros(n, 5, dtype=dt)
    inplace[me] = mine
    dist.all_gather(list(inplace.unbind(0)), inplace[me], group=mpi)
    check.check(f"in-place all_gather {dt}", torch.equal(inplace.reshape(-1), torch.cat(refs)))


def refusals(mpi, check):
    cases = [
        ("AVG on int64", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int64), R.AVG, group=mpi),
         "AVG on torch.int64"),
        ("BAND on float32", lambda: dist.all_reduce(torch.ones(3), R.BAND, group=mpi),
         "needs integer or bool"),
        ("uint16", lambda: dist.all_reduce(torch.ones(3, dtype=torch.uint16), group=mpi),
         "supported dtypes: float32"),
    ]
    for name, fn, text in cases:
        try:
            fn()
            check.check(f"refuses {name}", False, "did not raise")
        except (ValueError, TypeError, RuntimeError) as exc:
            check.check(f"refuses {name}", text in str(exc), str(exc))


def ddp(gloo, mpi, check):
    """DDP over mpi gives DDP over gloo's gradients, step by step (several buckets, BN buffers)."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    models = {}
    for name, g in (("gloo", gloo), ("mpi", mpi)):
        m = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), process_group=g,
                                                      bucket_cap_mb=0.002)
        models[name] = (m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
    gen = torch.Generator().manual_seed(1 + dist.get_rank())
    worst, moved = 0.0, 0.0
    for _ in range(6):
        x, y = torch.randn(16, 8, generator=gen), torch.randint(0, 4, (16,), generator=gen)
        grads = {}
        for name, (m, opt) in models.items():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            grads[name] = [p.grad.clone() for p in m.parameters()]
            opt.step()
        worst = max([worst] + [float((a - b).abs().max())
                               for a, b in zip(grads["gloo"], grads["mpi"], strict=True)])
    params = {name: [p.detach() for p in m.parameters()] for name, (m, _) in models.items()}
    moved = max(float((p - q).abs().max())
                for p, q in zip(params["mpi"], base.parameters(), strict=True))
    same_params = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6)
                      for a, b in zip(params["gloo"], params["mpi"], strict=True))
    # BatchNorm statistics follow the parameters, which differ in the last bit where the two
    # backends sum gradients in different orders (3 or more ranks).
    buffers = all(torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)
                  for a, b in zip(models["gloo"][0].buffers(), models["mpi"][0].buffers(),
                                  strict=True))
    check.check("ddp gradients", worst < 1e-6, f"max diff {worst}")
    check.check("ddp parameters", same_params and moved > 1e-2, f"moved {moved}")
    check.check("ddp buffers", buffers)
    return {"max_grad_diff": worst, "moved": moved}


def main() -> int:
    ctx = runtime.init(backend="gloo", device="cpu", timeout_s=120)
    n = ctx.world_size
    groups = {"world": (dist.group.WORLD, dist.new_group(backend="mpi"))}
    if n > 2:  # group ranks differ from global ranks, and rank 0 is not a member
        sub = list(range(1, n))
        groups["subgroup"] = (dist.new_group(sub, backend="gloo"), dist.new_group(sub, backend="mpi"))
    assert dist.get_backend(groups["world"][1]) == "mpi"
    check = Checker()
    parts = {}
    for part, fn in [("collectives", lambda: collectives(groups, check)),
                     ("path_thresholds", lambda: path_thresholds(*groups["world"], check)),
                     ("point_to_point", lambda: point_to_point(*groups["world"], check)),
                     ("async", lambda: async_handles(groups["world"][1], check)),
                     ("non_contiguous", lambda: non_contiguous(*groups["world"], check)),
                     ("refusals", lambda: refusals(groups["world"][1], check)),
                     ("ddp", lambda: ddp(*groups["world"], check))]:
        before = check.cases
        extra = fn()
        parts[part] = {"cases": check.cases - before, **(extra if isinstance(extra, dict) else {})}
    # allreduces from the threshold up went through shared memory (no silent fallback to MPI's)
    expected = int(os.environ.get("DOWNPOUR_MPI_SHM_MIN_BYTES", 16 << 10)) <= 300001
    shm_used = [g._shm._ready is True for _, g in groups.values() if isinstance(g, MPIProcessGroup)]
    check.check("shared-memory allreduce used as expected", shm_used == [expected] * len(shm_used),
                f"{shm_used}, expected {expected}")
    shm_in_c = [g._shm.in_c for _, g in groups.values()
                if isinstance(g, MPIProcessGroup) and g._shm._ready]
    subgroups = [g for pair in groups.values() for g in pair
                 if g is not dist.group.WORLD and g is not dist.GroupMember.NON_GROUP_MEMBER]
    for group in subgroups:  # one by one, before the default group (mpi ones too)
        dist.destroy_process_group(group)
    left = [g for g in subgroups if g in dist.distributed_c10d._world.pg_map]
    check.check("subgroups destroyed one by one", not left, f"{left} left")
    runtime.shutdown()
    before = check.cases
    sub_world(check)
    parts["sub_world"] = {"cases": check.cases - before}
    failures = MPI.COMM_WORLD.gather(check.failures, root=0)
    cases = MPI.COMM_WORLD.reduce(check.cases, root=0)
    if ctx.rank == 0:
        flat = [f for per_rank in failures for f in per_rank]
        print(json.dumps({"world_size": n, "cases": cases, "parts": parts, "failures": flat[:30],
                          "failure_count": len(flat), "data_phase_in_c": native.load() is not None,
                          "why_not_in_c": native.why_not(), "shm_in_c": shm_in_c}), flush=True)
    return 1 if check.failures else 0


def sub_world(check):
    """A job on some of the MPI processes (as ipyparallel engines run one): every rank but 1 makes
    the default group on a split of COMM_WORLD, with an mpi subgroup inside it."""
    world = MPI.COMM_WORLD
    sub = world.Split(int(world.Get_rank() == 1), key=world.Get_rank())
    members = [r for r in range(world.Get_size()) if r != 1]
    if world.Get_rank() != 1 and len(members) > 1:
        use_world(sub)
        dist.init_process_group("mpi")
        t = torch.full((5,), float(world.Get_rank()))
        dist.all_reduce(t)
        check.check("sub-world default group", (dist.get_rank(), dist.get_world_size()) ==
                    (sub.Get_rank(), sub.Get_size()) and torch.all(t == sum(members)).item())
        pair = dist.new_group([0, 1], backend="mpi")
        if dist.get_rank() < 2:
            t = torch.ones(3)
            dist.all_reduce(t, group=pair)
            check.check("sub-world subgroup", torch.all(t == 2).item())
        dist.destroy_process_group()
        use_world(None)
    sub.Free()


if __name__ == "__main__":
    sys.exit(main())
