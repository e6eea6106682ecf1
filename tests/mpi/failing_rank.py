"""Under mpiexec: rank 1 raises in the middle of training; the whole job must end promptly.

Arguments: ``[algorithm [backend]]`` (default sync_ps on gloo). With ``mpi`` the other ranks are
blocked inside MPI collectives, which have no timeout, so only aborting the MPI job can end them.
"""

import sys

from downpour_lib import TrainConfig, make_trainer, runtime

algorithm = sys.argv[1] if len(sys.argv) > 1 else "sync_ps"
backend = sys.argv[2] if len(sys.argv) > 2 else "gloo"
with runtime.abort_on_error():
    ctx = runtime.init(backend=backend, device="cpu", timeout_s=120)
    assert ctx.backend == backend, ctx

    def fail_on_rank_1(record):
        if ctx.rank == 1 and record.step == 3:
            raise RuntimeError("injected failure for the test")

    config = TrainConfig(algorithm=algorithm, model="mlp", dataset="digits", steps=100_000,
                         warmup_steps=1, threads=1, backend=backend)
    make_trainer(config, ctx, callbacks=[fail_on_rank_1]).run()
