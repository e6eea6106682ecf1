"""Under mpiexec -n 4: parameter servers sharded over several ranks give the same training.

1. sync_ps with 2 dedicated servers (2 workers) equals one process on the 2x batch.
2. sync_ps with 1, 2 and 3 colocated servers (4 workers each) equal each other and one process on
   the 4x batch.
3. downpour with 3 dedicated servers and 1 worker equals sequential training (every shard is a
   separate server, reached by message); colocated downpour applies every push of every worker.
4. sync_ps (2 dedicated servers) resumed from a checkpoint ends with the same parameters as a run
   that was not stopped, from the final checkpoint of a shorter run and from an every-K one.

Every rank compares its own final parameters; rank 0 prints one JSON line per case.
Usage: sharded_ps.py TMPDIR
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from reference import one_process

from downpour_lib import TrainConfig, make_trainer, runtime
from downpour_lib.comm.runtime import DistContext
from downpour_lib.models import build_model

BASE = dict(model="lenet", dataset="digits", steps=12, warmup_steps=1, lr=0.05, threads=1, seed=5,
            backend="gloo", weight_decay=1e-4)
B = 16


def final(config, ctx):
    trainer = make_trainer(config, ctx)
    result = trainer.run()
    return [p.detach().clone() for p in trainer.model.parameters()], result


def diff(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def report(ctx, case, d, **extra):
    worst = torch.tensor([d])
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # every rank's own parameters count
    if ctx.rank == 0:
        print(json.dumps({"case": case, "max_abs_diff": float(worst), **extra}), flush=True)
    return float(worst)


def main() -> int:
    tmp = Path(sys.argv[1])
    ctx = runtime.init(backend="gloo", device="cpu", timeout_s=120)
    assert ctx.world_size == 4, ctx
    single = DistContext.single()
    worst = 0.0
    torch.manual_seed(BASE["seed"])
    initial = [p.detach() for p in build_model("lenet", (1, 8, 8), 10).parameters()]

    _, local2 = one_process(BASE, 2 * B)
    sharded, result = final(TrainConfig(algorithm="sync_ps", batch_size=B,
                                        options={"servers": 2, "server": "dedicated"}, **BASE), ctx)
    worst = max(worst, report(ctx, "sync_ps 2 dedicated servers vs one process",
                              diff(sharded, local2), moved=diff(local2, initial),
                              workers=result.summary["num_workers"] if result else None))

    _, local4 = one_process(BASE, 4 * B)
    colocated = {}
    for servers in (1, 2, 3):
        colocated[servers], _ = final(TrainConfig(
            algorithm="sync_ps", batch_size=B, options={"servers": servers, "server": "colocated"},
            **BASE), ctx)
    worst = max(worst, report(ctx, "sync_ps colocated 2 and 3 servers vs 1",
                              max(diff(colocated[2], colocated[1]), diff(colocated[3], colocated[1]))))
    worst = max(worst, report(ctx, "sync_ps colocated vs one process", diff(colocated[3], local4)))

    options = {"servers": 3, "server": "dedicated"}
    downpour = make_trainer(TrainConfig(algorithm="downpour", batch_size=B, options=options, **BASE), ctx)
    downpour.run()
    sequential, _ = final(TrainConfig(algorithm="local", optimizer="adagrad", batch_size=B, **BASE),
                          single)
    if ctx.rank == downpour.roles.evaluator:  # the one worker: its model is the run's final one
        d = diff([p.detach() for p in downpour.model.parameters()], sequential)
    else:
        d = 0.0
    worst = max(worst, report(ctx, "downpour 3 servers 1 worker vs sequential", d))

    # colocated downpour: every rank a worker, two of them also serving (a thread beside the
    # worker); every push of every worker is applied before the servers stop
    options = {"servers": 2, "server": "colocated", "n_fetch": 2, "n_push": 3, "warmstart": 0}
    trainer = make_trainer(TrainConfig(algorithm="downpour", batch_size=B, options=options, **BASE), ctx)
    result = trainer.run()
    if ctx.rank == trainer.roles.evaluator:
        versions = [int(state["version"]) for state in trainer.algorithm.final]
        expected = 4 * -(-BASE["steps"] // 3)  # 4 workers, a push every 3 steps and at the end
        applied = [v == expected for v in versions]
        d = 0.0 if all(applied) else float("inf")
        pushes = int(result.steps.staleness.notna().sum()) if result else None
    else:
        d, versions, pushes = 0.0, None, None
    worst = max(worst, report(ctx, "downpour colocated: every push applied", d,
                              versions=versions, pushes_recorded=pushes))

    run = dict(algorithm="sync_ps", batch_size=B, options={"servers": 2, "server": "dedicated"},
               **{**BASE, "steps": 20})
    full, _ = final(TrainConfig(**run), ctx)
    ckpt = tmp / "sync_ps"
    final(TrainConfig(**{**run, "steps": 12}, checkpoint_dir=str(ckpt), checkpoint_every=5), ctx)
    resumed, result = final(TrainConfig(**run, resume=str(ckpt)), ctx)
    every_k, _ = final(TrainConfig(**run, resume=str(ckpt / "ckpt-00000010.pt"),
                                   checkpoint_dir=str(tmp / "other")), ctx)
    moved = diff(full, initial)  # training moved the parameters: equality is not vacuous
    worst = max(worst, report(ctx, "sync_ps resumed vs uninterrupted",
                              max(diff(resumed, full), diff(every_k, full)),
                              start_step=result.summary["start_step"] if result else None,
                              moved=moved))
    runtime.shutdown()
    return 0 if worst <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
