"""Under mpiexec: rank 1 raises in the middle of training; the whole job must end promptly.

The algorithm is the first argument (default sync_ps)."""

import sys

from downpour_lib import TrainConfig, Trainer, runtime

with runtime.abort_on_error():
    ctx = runtime.init(backend="gloo", device="cpu", timeout_s=120)

    def fail_on_rank_1(record):
        if ctx.rank == 1 and record.step == 3:
            raise RuntimeError("injected failure for the test")

    algorithm = sys.argv[1] if len(sys.argv) > 1 else "sync_ps"
    config = TrainConfig(algorithm=algorithm, model="mlp", dataset="digits", steps=100_000,
                         warmup_steps=1, threads=1)
    Trainer(config, ctx, callbacks=[fail_on_rank_1]).run()
