"""Under mpiexec -n 2: Downpour with 1 server and 1 worker, fetching and pushing every step,
is sequential training with the server's optimizer.

The worker's gradients travel to the server by message and the parameters come back; with one
worker nothing is stale, so the run must equal `local` with the same optimizer. The worker (the
evaluator, whose model ends as the run's final model) computes the reference itself and prints one
JSON line per case.
"""

import json
import sys

from downpour_lib import TrainConfig, make_trainer, runtime
from downpour_lib.comm.runtime import DistContext

BASE = dict(model="lenet", dataset="digits", steps=25, warmup_steps=1, lr=0.05, threads=1, seed=4,
            backend="gloo", batch_size=16)


def main() -> int:
    ctx = runtime.init(backend="gloo", device="cpu", timeout_s=120)
    assert ctx.world_size == 2, ctx
    failed = False
    for optimizer in ("adagrad", "sgd"):
        options = {"servers": 1, "server": "dedicated", "n_fetch": 1, "n_push": 1}
        trainer = make_trainer(TrainConfig(algorithm="downpour", optimizer=optimizer, options=options,
                                           **BASE), ctx)
        assert trainer.roles.servers == (0,) and trainer.roles.workers == (1,)
        trainer.run()
        if ctx.rank != trainer.roles.evaluator:
            continue
        reference = make_trainer(TrainConfig(algorithm="local", optimizer=optimizer, **BASE),
                                 DistContext.single())
        initial = [p.detach().clone() for p in reference.model.parameters()]
        reference.run()
        pairs = list(zip([p.detach() for p in trainer.model.parameters()],
                         [p.detach() for p in reference.model.parameters()], strict=True))
        diff = max(float((a - b).abs().max()) for a, b in pairs)
        moved = max(float((b - a).abs().max())
                    for a, b in zip(initial, [p.detach() for p in reference.model.parameters()],
                                    strict=True))
        failed |= not diff <= 1e-6
        print(json.dumps({"optimizer": optimizer, "max_abs_diff": diff, "reference_moved": moved,
                          "staleness": [r.extras["staleness"] for r in trainer.step_records],
                          "bytes_sent": [r.bytes_sent for r in trainer.step_records],
                          "bytes_received": [r.bytes_received for r in trainer.step_records]}),
              flush=True)
    runtime.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
