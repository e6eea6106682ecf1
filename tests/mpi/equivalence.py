"""Under mpiexec -n 3: distributed synchronous SGD equals one process on the N-times batch.

Every rank trains the distributed run, then computes the single-process reference itself (a world
of one, no communication) and compares its own final parameters with it. Prints one JSON line per
case from rank 0; exits non-zero if any rank's parameters differ beyond 1e-5.
"""

import json
import sys

import torch

from downpour_lib import TrainConfig, Trainer, runtime
from downpour_lib.comm.runtime import DistContext

BASE = dict(model="mlp", dataset="digits", steps=20, warmup_steps=1, lr=0.05, momentum=0.9,
            weight_decay=1e-4, threads=1, seed=3, backend="gloo")
B = 16
# warm-up over the first 0.2 epochs, then 10x smaller from 0.35 epochs on (of 20 steps, at 29-44
# steps per epoch)
SCHEDULE = dict(lr_schedule="step", lr_warmup_epochs=0.2, lr_milestones=(0.35,), lr_decay=0.1)


def train(config, ctx):
    """(initial, final) parameters of one run on this rank."""
    trainer = Trainer(config, ctx)
    initial = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.run()
    return initial, [p.detach().clone() for p in trainer.model.parameters()]


def main() -> int:
    ctx = runtime.init(backend="gloo", device="cpu", timeout_s=120)
    assert ctx.world_size == 3, ctx
    cases = [
        ("sync_ps dedicated, 2 workers", dict(algorithm="sync_ps", options={"server": "dedicated"}), 2),
        ("sync_ps colocated, 3 workers", dict(algorithm="sync_ps", options={"server": "colocated"}), 3),
        ("ddp, 3 workers", dict(algorithm="ddp"), 3),
        # the schedule is a function of the step and the global batch: still the same run
        ("sync_ps dedicated, 2 workers, warm-up + step decay",
         dict(algorithm="sync_ps", options={"server": "dedicated"}, **SCHEDULE), 2),
        ("allreduce, 3 workers, warm-up + step decay, linear scaling",
         dict(algorithm="allreduce", lr_scaling="linear", lr_reference_batch=32, **SCHEDULE), 3),
    ]
    failed = False
    for name, change, workers in cases:
        _, dist_params = train(TrainConfig(**BASE, **change, batch_size=B), ctx)
        same = {k: v for k, v in change.items() if k.startswith("lr_")}
        initial, ref_params = train(TrainConfig(**BASE, algorithm="local", batch_size=workers * B,
                                                **same), DistContext.single())
        # Training must have moved the parameters, or equality would prove nothing.
        moved = max(float((r - p0).abs().max()) for r, p0 in zip(ref_params, initial, strict=True))
        diff = max(float((d - r).abs().max()) for d, r in zip(dist_params, ref_params, strict=True))
        pairs = zip(dist_params, ref_params, strict=True)
        ok = all(torch.allclose(d, r, rtol=1e-5, atol=1e-5) for d, r in pairs)
        failed |= not ok
        all_ok = runtime_all(ok)
        if ctx.rank == 0:
            print(json.dumps({"case": name, "max_abs_diff": diff, "ok_all_ranks": all_ok,
                              "reference_moved": moved}), flush=True)
    runtime.shutdown()
    return 1 if failed else 0


def runtime_all(flag: bool) -> bool:
    t = torch.tensor([0 if flag else 1])
    torch.distributed.all_reduce(t)
    return int(t) == 0


if __name__ == "__main__":
    sys.exit(main())
