"""Under mpiexec -n 4: the low-communication methods against their references. One JSON line per
case from rank 0; a case's ``max_abs_diff`` is the largest difference of any rank's parameters.

- diloco with H = 1, inner SGD without momentum, outer lr 1, no outer momentum = allreduce SGD;
- localsgd with period 1 = allreduce SGD (momentum and weight decay too: both are linear);
- slowmo with slow momentum 0 and slow lr 1 = localsgd with the same period;
- localsgd = a plain loop with PyTorch's PeriodicModelAverager;
- easgd on a quadratic = its update written out (every rank knows every target);
- bytes: diloco's and localsgd's traffic over a run against allreduce's.

Their accuracy on digits is trained in digits.py.
"""

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from downpour_lib import TrainConfig, make_trainer, runtime
from downpour_lib.algorithms import make_algorithm
from downpour_lib.data import ShardSampler, load_dataset
from downpour_lib.models import build_model

BASE = dict(model="mlp", dataset="digits", batch_size=16, steps=24, warmup_steps=1, lr=0.05,
            momentum=0.9, weight_decay=1e-4, threads=1, seed=3, backend="gloo", final_eval=False)


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def train(ctx, **change):
    trainer = make_trainer(TrainConfig(**{**BASE, **change}), ctx)
    result = trainer.run()
    return params(trainer.model), result


def max_diff(ctx, a, b) -> float:
    d = torch.tensor([max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))])
    dist.all_reduce(d, op=dist.ReduceOp.MAX)
    return float(d)


def moved(ctx, a, b) -> float:
    return max_diff(ctx, a, b)


def averager_loop(ctx, period: int):
    """PyTorch's periodic model averaging after every optimizer step, on the engine's data."""
    config = TrainConfig(**BASE)
    train_split = load_dataset("digits").train
    torch.manual_seed(config.data.seed)
    model = build_model("mlp", train_split.input_shape, train_split.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=config.optim.lr, momentum=config.optim.momentum,
                          weight_decay=config.optim.weight_decay)
    sampler = ShardSampler(len(train_split), config.data.batch_size, ctx.rank, ctx.world_size,
                           config.data.seed)
    averager = PeriodicModelAverager(period=period, warmup_steps=0)
    for step in range(config.length.steps):
        _, idx = sampler.indices(step)
        x, y = train_split.batch(idx)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        averager.average_parameters(model.parameters())
    return params(model)


def easgd_quadratic(ctx, steps=9, period=2, alpha=0.2, eta=0.3):
    """x_i's loss is |x_i - a_i|^2 / 2; the algorithm in a loop of our own, and the same update
    written out for every rank."""
    targets = torch.arange(ctx.world_size * 3, dtype=torch.float64).view(ctx.world_size, 3)
    model = torch.nn.Module()
    model.x = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    algo = make_algorithm("easgd", ctx, period=period, moving_rate=alpha)
    opt = torch.optim.SGD(model.parameters(), lr=eta)
    algo.setup(model, opt)
    algo.start(range(steps))
    for _ in range(steps):
        opt.zero_grad()
        (0.5 * (model.x - targets[ctx.rank]).pow(2).sum()).backward()
        algo.after_backward(model)
        algo.step(opt)
        algo.after_step(model)
    algo.close()
    xs, center = torch.zeros_like(targets), torch.zeros(3, dtype=torch.float64)
    for t in range(1, steps + 1):
        xs = xs - eta * (xs - targets)
        if t % period == 0:
            diff = xs - center
            xs, center = xs - alpha * diff, center + alpha * diff.sum(0)
    return (max_diff(ctx, [model.x.detach()], [xs[ctx.rank]]),
            max_diff(ctx, [algo.center], [center]), float(center.abs().max()))


def main() -> int:
    ctx = runtime.init(backend="gloo", device="cpu", timeout_s=120)
    assert ctx.world_size == 4, ctx
    torch.set_num_threads(1)
    cases = []
    plain = dict(momentum=0.0)
    allreduce_plain, ar = train(ctx, algorithm="allreduce", **plain)
    diloco, dl = train(ctx, algorithm="diloco", optimizer="sgd", **plain,
                       options={"period": 1, "outer_lr": 1.0, "outer_momentum": 0.0})
    cases.append(("diloco H=1 vs allreduce", max_diff(ctx, diloco, allreduce_plain)))
    allreduce, _ = train(ctx, algorithm="allreduce")
    local1, _ = train(ctx, algorithm="localsgd", options={"period": 1})
    cases.append(("localsgd period 1 vs allreduce", max_diff(ctx, local1, allreduce)))
    local3, l3 = train(ctx, algorithm="localsgd", options={"period": 3})
    slowmo, _ = train(ctx, algorithm="slowmo", options={"period": 3, "slow_momentum": 0.0,
                                                         "slow_lr": 1.0})
    cases.append(("slowmo beta 0 alpha 1 vs localsgd", max_diff(ctx, slowmo, local3)))
    cases.append(("localsgd vs PeriodicModelAverager", max_diff(ctx, local3, averager_loop(ctx, 3))))
    # the comparisons above are not vacuous: local steps differ from synchronous ones
    cases.append(("localsgd period 3 vs allreduce (should differ)", max_diff(ctx, local3, allreduce)))
    x_err, center_err, center = easgd_quadratic(ctx)
    _, dl20 = train(ctx, algorithm="diloco", options={"period": 8})
    if ctx.rank == 0:
        for name, diff in cases:
            print(json.dumps({"case": name, "max_abs_diff": diff}), flush=True)
        print(json.dumps({"case": "easgd quadratic", "x_err": x_err, "center_err": center_err,
                          "center": center}), flush=True)
        sent = {name: float(r.steps.bytes_sent.sum())
                for name, r in (("allreduce", ar), ("localsgd 3", l3), ("diloco 8", dl20))}
        outer = dl20.steps.groupby("step").outer_step.max().tolist()
        print(json.dumps({"case": "bytes", "sent": sent, "diloco_outer_steps": outer}), flush=True)
    runtime.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
