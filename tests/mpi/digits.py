"""Under mpiexec -n 4: every algorithm whose test asks for 90% on digits, trained one after another
in this one session (lenet, 10 epochs, each with its defaults unless named below), so the suite
starts four ranks and loads the data once for all of them, not once per algorithm.

Rank 0 prints one JSON line per run: ``case``, the run's summary, and what the checks read besides
(the evaluations' consensus distances and ranks, the server's updates). The checks are in
tests/test_multirank.py (sync_ps), test_downpour_multirank.py (downpour), test_periodic.py (diloco,
localsgd, easgd, slowmo, easgd_async) and test_gossip_multirank.py (sgp, osgp, dpsgd, adpsgd); they
read it through the ``digits_runs`` fixture of tests/conftest.py. Exits non-zero on an exception.
"""

import json
import sys

import torch

from downpour_lib import TrainConfig, make_trainer, runtime

BASE = dict(model="lenet", dataset="digits", epochs=10, threads=1, backend="gloo", device="cpu")
RUNS = [
    ("sync_ps", dict(algorithm="sync_ps", batch_size=32)),
    # 15 epochs: at 10 its asynchronous pushes landed it at 0.917-0.956 in nine runs here and 0.894
    # in one CI run; at 15, 0.953-0.969 in five, for 3 CPU-s more (most of its time is the server's)
    ("downpour", dict(algorithm="downpour", epochs=15,
                      options={"servers": 1, "n_fetch": 1, "n_push": 1})),
    ("diloco", dict(algorithm="diloco")),
    ("localsgd", dict(algorithm="localsgd")),
    ("easgd", dict(algorithm="easgd")),
    ("slowmo", dict(algorithm="slowmo")),
    ("easgd_async", dict(algorithm="easgd_async")),
    # evaluated every 40 steps: three evaluations, each with its consensus distance
    *((name, dict(algorithm=name, eval_every=40)) for name in ("sgp", "osgp", "dpsgd", "adpsgd")),
]


def main() -> int:
    ctx = runtime.init(backend="gloo", device="cpu", timeout_s=120)
    assert ctx.world_size == 4, ctx
    torch.set_num_threads(1)
    only = set(sys.argv[1:])  # by hand: `digits.py sgp downpour` runs those two
    for case, change in RUNS:
        if only and case not in only:
            continue
        result = make_trainer(TrainConfig(**{**BASE, **change}), ctx).run()
        if ctx.rank == 0:
            evals = result.evals
            print(json.dumps({
                "case": case, **result.summary,
                "eval_consensus": evals.consensus_distance.tolist()
                if "consensus_distance" in evals else None,
                "eval_ranks": sorted(set(evals["rank"].tolist())),
                "server_updates": int((result.steps.role == "server").sum())}, default=str),
                flush=True)
    runtime.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
