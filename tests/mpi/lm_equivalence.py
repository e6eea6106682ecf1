"""Under mpiexec -n 3: synchronous data parallelism on the language model equals one process on
the N-times batch, loss and parameters (to 1e-5), as equivalence.py checks for the classifiers.

Prints one JSON line per case from rank 0; exits non-zero if any rank differs beyond 1e-5.
"""

import json
import sys

import torch
from reference import compare, one_process, trained

from downpour_lib import TrainConfig, runtime
from downpour_lib.comm.runtime import DistContext

BASE = dict(model="gpt-nano", dataset="stdlib-text", steps=8, warmup_steps=1, lr=0.05,
            momentum=0.9, threads=1, seed=3, backend="gloo", final_eval=False)
B = 4


def main() -> int:
    ctx = runtime.init(backend="gloo", device="cpu", timeout_s=120)
    assert ctx.world_size == 3, ctx
    cases = [("allreduce, 3 workers", dict(algorithm="allreduce"), 3),
             ("sync_ps dedicated, 2 workers", dict(algorithm="sync_ps",
                                                    options={"server": "dedicated"}), 2)]
    failed = False
    for name, change, workers in cases:
        _, params, result = trained(TrainConfig(**BASE, **change, batch_size=B), ctx)
        initial, ref_params = one_process(BASE, workers * B)
        c = compare(params, ref_params, initial)
        loss_diff = 0.0
        if ctx.rank == 0:  # each step's loss, the workers' mean, against the reference's
            reference = TrainConfig(**{**BASE, "algorithm": "local", "batch_size": workers * B})
            ref = trained(reference, DistContext.single())[2].steps.set_index("step").loss
            mine = result.steps[result.steps.role == "worker"].groupby("step").loss.mean()
            loss_diff = float((mine - ref).abs().max())
        ok = c["close"] and loss_diff < 1e-5
        failed |= not ok
        flag = torch.tensor([0 if ok else 1])
        torch.distributed.all_reduce(flag)
        if ctx.rank == 0:
            print(json.dumps({"case": name, "max_abs_diff": c["max_abs_diff"],
                              "max_loss_diff": loss_diff, "ok_all_ranks": int(flag) == 0,
                              "reference_moved": c["reference_moved"]}), flush=True)
    runtime.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
