"""Under mpiexec -n 3: distributed synchronous SGD equals one process on the N-times batch.

Every rank trains the distributed run, then computes the single-process reference itself
(reference.py) and compares its own final parameters with it. Prints one JSON line per
case from rank 0; exits non-zero if any rank's parameters differ beyond 1e-5.
"""

import json
import sys

import torch
from reference import compare, one_process, trained

from downpour_lib import TrainConfig, runtime

BASE = dict(model="mlp", dataset="digits", steps=20, warmup_steps=1, lr=0.05, momentum=0.9,
            weight_decay=1e-4, threads=1, seed=3, backend="gloo")
B = 16
# warm-up over the first 0.2 epochs, then 10x smaller from 0.35 epochs on (of 20 steps, at 29-44
# steps per epoch)
SCHEDULE = dict(lr_schedule="step", lr_warmup_epochs=0.2, lr_milestones=(0.35,), lr_decay=0.1)


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
        _, dist_params, _ = trained(TrainConfig(**BASE, **change, batch_size=B), ctx)
        same = {k: v for k, v in change.items() if k.startswith("lr_")}
        initial, ref_params = one_process(BASE, workers * B, **same)
        c = compare(dist_params, ref_params, initial)
        ok, diff, moved = c["close"], c["max_abs_diff"], c["reference_moved"]
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
