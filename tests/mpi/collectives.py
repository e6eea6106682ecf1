"""Under mpiexec -n N (2..4): the collectives API, groups, the hierarchy, the model helpers, and
AllReduce SGD, each checked against a reference every rank can compute by itself.

Every rank's input is a pure function of its rank, so each rank knows what every collective must
return. Training cases compare with one process on the N-times batch (a world of one, run by each
rank itself), with DDP on the same data, or with the exact gradient average. Prints one JSON line
per case from rank 0 ({"case", "ok", ...}); exits non-zero if any case failed on any rank.
The backend is gloo unless given as the first argument (``collectives.py mpi``).
"""

import json
import sys

import torch
import torch.nn.functional as F
from reference import compare as compared
from reference import one_process, trained
from torch import nn

from downpour_lib import TrainConfig, comm, runtime
from downpour_lib.algorithms import make_algorithm

BASE = dict(model="mlp", dataset="digits", steps=16, warmup_steps=1, lr=0.05, momentum=0.9,
            weight_decay=1e-4, threads=1, seed=3, backend="gloo")
B = 16
HOST_LAYOUTS = {2: [("a", "a"), ("a", "b")], 3: [("a", "a", "b"), ("a", "b", "a")],
                4: [("a", "a", "b", "b"), ("a", "a", "a", "b"), ("a", "b", "a", "b")]}


def data(rank, *shape, dtype=torch.float64):
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(*shape, generator=g, dtype=dtype)


def close(a, b, tol=1e-12):
    return a.shape == b.shape and torch.allclose(a, b, rtol=tol, atol=tol)


# -- the collectives API ----------------------------------------------------------------------------

def case_collectives(ctx):
    n, r = ctx.world_size, ctx.rank
    xs = [data(q, 5, 3) for q in range(n)]
    total = sum(xs)
    checks = {}
    y = xs[r].clone()
    checks["allreduce tensor, sync"] = comm.allreduce(y) is y and close(y, total)
    sync_list = [data(r, 4, 2), data(r + 50, 7)]
    comm.allreduce(sync_list, op="mean")
    async_list = [data(r, 4, 2), data(r + 50, 7)]
    handle = comm.allreduce(async_list, op="mean", async_op=True)
    result = handle.wait()
    checks["allreduce list, async: handle completes"] = handle.is_completed() and result is async_list
    checks["allreduce list, async equals sync"] = all(torch.equal(a, s) for a, s in
                                                      zip(async_list, sync_list, strict=True))
    checks["allreduce list round trip"] = (
        close(sync_list[0], sum(data(q, 4, 2) for q in range(n)) / n)
        and close(sync_list[1], sum(data(q + 50, 7) for q in range(n)) / n))
    # Large enough for the mpi backend to reduce the list where it lies (its shared-memory slots,
    # chunk by chunk): a piece that spans chunks, an empty one, a non-contiguous one.
    def big(q):
        return [data(q, 300, 301), data(q + 7, 0), data(q + 9, 262147), data(q + 11, 60, 50).t()]
    big_list = big(r)
    comm.allreduce(big_list, op="mean")
    checks["allreduce large list, mean"] = all(
        close(got, sum(big(q)[i] for q in range(n)) / n) for i, got in enumerate(big_list))
    checks["allreduce large list: every rank the same bits"] = torch.equal(
        comm.broadcast(big_list[2].clone(), root=0), big_list[2])
    t = xs[r].clone().t()  # not contiguous: reduced in a copy and written back
    comm.allreduce(t, op="max")
    checks["allreduce max, non-contiguous"] = close(t, torch.stack(xs).amax(0).t())
    ints = torch.arange(6) * (r + 1)
    comm.allreduce(ints)
    checks["allreduce int64, exact"] = torch.equal(ints, torch.arange(6) * sum(range(1, n + 1)))

    root = n - 1
    b = xs[r].clone()
    pair = [xs[r][0].clone(), xs[r][1:].clone()]
    handle = comm.broadcast(pair, root=root, async_op=True)
    comm.broadcast(b, root=root)
    handle.wait()
    checks["broadcast tensor and list"] = (close(b, xs[root]) and close(pair[0], xs[root][0])
                                           and close(pair[1], xs[root][1:]))
    red = xs[r].clone()
    comm.reduce(red, root=root, op="sum")
    checks["reduce: root has the sum, others unchanged"] = close(red, total if r == root else xs[r])

    gathered = comm.allgather(xs[r])
    checks["allgather tensor"] = all(close(g, x) for g, x in zip(gathered, xs, strict=True))
    glist = comm.allgather([xs[r][0], xs[r][1:]], async_op=True).wait()
    checks["allgather list"] = all(close(g[0], x[0]) and close(g[1], x[1:]) for g, x in
                                     zip(glist, xs, strict=True))

    big = [data(q, 2 * n, 3) for q in range(n)]
    part = comm.reduce_scatter(big[r].clone())
    checks["reduce_scatter tensor"] = close(part, sum(big).chunk(n)[r])
    odd = [[data(q, 3, 3), data(q + 9, 5)] for q in range(n)]  # 14 elements: padded to n shards
    shard = comm.reduce_scatter(odd[r], op="mean", async_op=True).wait()
    flat = sum(torch.cat([a.reshape(-1), c]) for a, c in odd) / n
    start, stop = comm.shard_bounds(flat.numel(), n, r)
    padded = torch.cat([flat, flat.new_zeros(stop * n)])
    checks["reduce_scatter list, padded shards"] = close(shard, padded[start:stop])
    return {"ok": all(checks.values()), "failed": [k for k, v in checks.items() if not v]}


def case_groups(ctx):
    n, r = ctx.world_size, ctx.rank
    evens = comm.new_group(range(0, n, 2))
    halves = comm.split([list(range(0, n, 2)), list(range(1, n, 2))])
    checks = {"membership": evens.member == (r % 2 == 0) and halves.ranks == tuple(range(r % 2, n, 2))}
    if evens.member:
        x = data(r, 6)
        evens.allreduce(x)
        checks["allreduce in a group"] = close(x, sum(data(q, 6) for q in range(0, n, 2)))
        y = data(r, 3)
        evens.broadcast(y, root=evens.size - 1)
        checks["broadcast from a group rank"] = close(y, data(evens.ranks[-1], 3))
    else:
        try:
            evens.allreduce(data(r, 6))
            checks["non-member refused"] = False
        except RuntimeError as exc:
            checks["non-member refused"] = "not a member" in str(exc)
    z = data(r, 4)
    halves.allreduce(z, op="mean")
    mine = list(range(r % 2, n, 2))
    checks["split halves"] = close(z, sum(data(q, 4) for q in mine) / len(mine))
    return {"ok": all(checks.values()), "failed": [k for k, v in checks.items() if not v]}


def case_hierarchy(ctx, hosts):
    n, r = ctx.world_size, ctx.rank
    h = comm.Hierarchy.create(hosts=hosts)
    node = tuple(q for q in range(n) if hosts[q] == hosts[r])
    leaders = tuple(min(q for q in range(n) if hosts[q] == host) for host in dict.fromkeys(hosts))
    checks = {"groups": h.local.ranks == node and h.is_leader == (r == node[0])
              and (h.leaders is None or h.leaders.ranks == leaders)}
    x = data(r, 1000, dtype=torch.float32)
    flat = x.clone()
    comm.allreduce(flat)
    h.allreduce(x)
    checks["equals flat allreduce"] = torch.allclose(x, flat, rtol=1e-6, atol=1e-6)
    ints = [torch.full((3, 3), float(r + 1)), torch.arange(5.0) * r]  # exact in any order
    h.allreduce(ints, op="mean")
    checks["list, mean, exact"] = (torch.equal(ints[0], torch.full((3, 3), (n + 1) / 2))
                                   and torch.equal(ints[1], torch.arange(5.0) * (n - 1) / 2))
    return {"hosts": list(hosts), "max_abs_diff": float((x - flat).abs().max()),
            "ok": all(checks.values()), "failed": [k for k, v in checks.items() if not v]}


# -- model helpers ------------------------------------------------------------------------------------

def mlp(hidden=32):
    return nn.Sequential(nn.Linear(20, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def case_synchronize_parameters(ctx):
    n, r = ctx.world_size, ctx.rank
    checks = {}
    torch.manual_seed(r)  # different weights on every rank
    model = mlp(32 if r != n - 1 else 31)  # the last rank's hidden layer is one unit short
    try:
        comm.synchronize_parameters(model)
        message = ""
    except comm.ModelMismatchError as exc:
        message = str(exc)
    checks["mismatch named"] = ("parameter '0.weight'" in message and f"rank(s) {n - 1}" in message
                                and "(31, 20)" in message)
    torch.manual_seed(r)
    model = mlp()
    if r == 1:
        model.add_module("3", nn.Linear(10, 2))
    try:
        comm.synchronize_parameters(model)
        extra = ""
    except comm.ModelMismatchError as exc:
        extra = str(exc)
    checks["extra parameter named"] = "'3.weight' exists on rank(s) 1 but not on rank 0" in extra
    torch.manual_seed(r)
    model = mlp()
    comm.synchronize_parameters(model, root=n - 1)
    torch.manual_seed(n - 1)
    root_model = mlp()
    checks["parameters are the root's"] = all(torch.equal(a, b) for a, b in
                                              zip(model.parameters(), root_model.parameters(), strict=True))
    x = data(r, 8, 20, dtype=torch.float32)
    model(x).square().mean().backward()
    model[2].bias.grad = None if r == 0 else model[2].bias.grad  # rank 0 has no gradient for it
    expect = []
    for q in range(n):
        ref = mlp()
        ref.load_state_dict(root_model.state_dict())
        ref(data(q, 8, 20, dtype=torch.float32)).square().mean().backward()
        if q == 0:
            ref[2].bias.grad.zero_()
        expect.append([p.grad for p in ref.parameters()])
    comm.synchronize_gradients(model)
    mean = [sum(g[i] for g in expect) / n for i in range(len(expect[0]))]
    checks["gradients averaged"] = all(torch.allclose(p.grad, m, rtol=1e-5, atol=1e-6)
                                       for p, m in zip(model.parameters(), mean, strict=True))
    return {"ok": all(checks.values()), "failed": [k for k, v in checks.items() if not v],
            "message": message}


# -- AllReduce SGD --------------------------------------------------------------------------------------

def compare(params, ref, initial, tol=1e-5):
    c = compared(params, ref, initial, tol)
    return {"ok": c["close"] and c["reference_moved"] > 1e-2, "max_abs_diff": c["max_abs_diff"],
            "reference_moved": c["reference_moved"]}


def case_training(ctx, options, reference, steps=BASE["steps"]):
    """``reference``: "local" (one process, N-times batch) or "ddp" (same data)."""
    n = ctx.world_size
    k = options.get("accumulation_steps", 1)
    # k micro-batches of B per rank are one step on n k B samples (all within the first epoch)
    base = {**BASE, "steps": steps}
    _, params, result = trained(TrainConfig(**{**base, "steps": steps * k}, algorithm="allreduce",
                                            options=options, batch_size=B), ctx)
    if reference == "ddp":
        initial, ref, _ = trained(TrainConfig(**base, algorithm="ddp", batch_size=B), ctx)
    else:
        initial, ref = one_process(base, n * k * B)
    out = compare(params, ref, initial)
    if result is not None:  # rank 0: the records add up
        steps = result.steps
        out["bytes_per_step"] = float(steps.bytes_sent.mean())
        out["ok"] &= bool((steps.bytes_sent > 0).any())
    return out


def case_compression(ctx, wire):
    """One step's averaged gradient is within the wire dtype's rounding of the exact average."""
    n, r = ctx.world_size, ctx.rank
    torch.manual_seed(0)
    model = mlp(64)
    alg = make_algorithm("allreduce", ctx, compression=wire, bucket_cap_mb=0.004)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    alg.setup(model, opt)
    grads = []
    for q in range(n):  # every rank's gradient, computed here on a copy
        ref = mlp(64)
        ref.load_state_dict(model.state_dict())
        F.cross_entropy(ref(data(q, 8, 20, dtype=torch.float32)), data(q, 8).abs().long() % 10).backward()
        grads.append([p.grad for p in ref.parameters()])
    F.cross_entropy(model(data(r, 8, 20, dtype=torch.float32)), data(r, 8).abs().long() % 10).backward()
    alg.after_backward(model)
    finfo = torch.finfo({"fp16": torch.float16, "bf16": torch.bfloat16}[wire])
    # rounding each input (eps/2 of |g_q|/n) plus n-1 rounded additions: <= n eps/2 max_q |g_q|
    ok, worst, changed = True, 0.0, False
    for i, p in enumerate(model.parameters()):
        exact = sum(g[i] for g in grads) / n
        bound = n * finfo.eps / 2 * torch.stack([g[i].abs() for g in grads]).amax(0) \
            + n * finfo.smallest_normal * finfo.eps  # the spacing of subnormals
        err = (p.grad - exact).abs()
        ok &= bool((err <= bound).all())
        changed |= bool((err > 0).any())
        worst = max(worst, float((err / bound).max()))
    alg.close()
    return {"ok": ok and changed, "worst_error_over_bound": worst, "rounded": changed}


class Branchy(nn.Module):
    """A trunk and head always used, a side branch used on some ranks, a dead branch never used."""

    def __init__(self):
        super().__init__()
        self.trunk, self.head = nn.Linear(20, 32), nn.Linear(32, 10)
        self.side, self.dead = nn.Linear(32, 10), nn.Linear(32, 10)

    def forward(self, x, use_side):
        h = torch.relu(self.trunk(x))
        return self.head(h) + self.side(h) if use_side else self.head(h)


def case_unused_parameters(ctx, bucket_cap_mb):
    """Rank 0 uses the side branch on even steps only, nobody uses the dead one: no hang, and the
    result equals one process summing every rank's loss (a globally unused parameter stays put)."""
    n, r = ctx.world_size, ctx.rank
    torch.manual_seed(1)
    model, ref = Branchy(), Branchy()
    ref.load_state_dict(model.state_dict())
    alg = make_algorithm("allreduce", ctx, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    model = alg.setup(model, opt)
    dead0, side0 = model.dead.weight.detach().clone(), model.side.weight.detach().clone()
    for step in range(4):
        def batch(q, step=step):
            return data(100 * step + q, 8, 20, dtype=torch.float32), data(q, 8).abs().long() % 10

        opt.zero_grad(set_to_none=True)
        x, y = batch(r)
        F.cross_entropy(model(x, r == 0 and step % 2 == 0), y).backward()
        alg.after_backward(model)
        alg.step(opt)
        ref_opt.zero_grad(set_to_none=True)
        sum(F.cross_entropy(ref(*batch(q)[:1], q == 0 and step % 2 == 0), batch(q)[1])
            for q in range(n)).div(n).backward()
        ref_opt.step()
    alg.close()
    with torch.no_grad():
        diff = max(float((p - q).abs().max()) for p, q in zip(model.parameters(), ref.parameters(),
                                                                strict=True))
        side_moved = float((model.side.weight - side0).abs().max())
    ok = (diff < 1e-5 and side_moved > 1e-3 and torch.equal(model.dead.weight, dead0)
          and model.dead.weight.grad is None)
    return {"ok": ok, "max_abs_diff": diff, "side_moved": side_moved}


def all_ranks(flag):
    t = torch.tensor([0 if flag else 1])
    torch.distributed.all_reduce(t)
    return int(t) == 0


def main() -> int:
    backend = sys.argv[1] if len(sys.argv) > 1 else "gloo"
    BASE["backend"] = backend
    ctx = runtime.init(backend=backend, device="cpu", timeout_s=60)
    torch.set_num_threads(1)
    n = ctx.world_size
    cases = [("collectives", lambda: case_collectives(ctx)), ("groups", lambda: case_groups(ctx))]
    cases += [(f"hierarchy {''.join(h)}", lambda h=h: case_hierarchy(ctx, h)) for h in HOST_LAYOUTS[n]]
    cases += [
        ("synchronize_parameters", lambda: case_synchronize_parameters(ctx)),
        ("allreduce sgd = one process", lambda: case_training(ctx, {}, "local")),
        ("allreduce sgd, small buckets = one process",
         lambda: case_training(ctx, {"bucket_cap_mb": 0.01}, "local")),
        ("allreduce sgd = ddp", lambda: case_training(ctx, {"bucket_cap_mb": 0.02}, "ddp")),
        ("accumulation k=3 = one step on the 3x batch",
         lambda: case_training(ctx, {"accumulation_steps": 3, "bucket_cap_mb": 0.02}, "local",
                                       steps=5)),
        ("compression fp16", lambda: case_compression(ctx, "fp16")),
        ("compression bf16", lambda: case_compression(ctx, "bf16")),
        ("unused parameters, one bucket", lambda: case_unused_parameters(ctx, 25.0)),
        ("unused parameters, small buckets", lambda: case_unused_parameters(ctx, 0.001)),
    ]
    failed = False
    with runtime.abort_on_error():
        for name, run in cases:
            out = run()
            ok = all_ranks(out["ok"])
            failed |= not ok
            if ctx.rank == 0:
                print(json.dumps({"case": name, **out, "ok": ok}), flush=True)
    runtime.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
