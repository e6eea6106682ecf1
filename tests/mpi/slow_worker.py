"""Under mpiexec -n 4 (1 server, 3 workers): one worker made slow must not slow the others.

Three runs in the same processes, back to back: downpour with no slow worker (the reference),
downpour with rank 3 sleeping after each of its first steps (a test-only hook through the
engine's callbacks), and sync_ps with the same slow rank (the contrast: there the slow worker sets
everyone's pace, so the measurement can tell blocking from not blocking). Rank 0 prints one JSON
line per run: each worker's step rate over its own steps (steps per second of its own clock, after
warm-up, while it is slow for the slow one) and the staleness records.
"""

import json
import sys
import time

from downpour_lib import TrainConfig, make_trainer, runtime

SLOW_RANK, SLEEP_S, SLOW_STEPS = 3, 0.2, 20
BASE = dict(model="mlp", dataset="digits", batch_size=16, warmup_steps=3, threads=1, seed=0,
            backend="gloo")


def rate(own, first, last):
    """Steps per second between the ends of steps ``first`` and ``last`` of one worker."""
    own = own.set_index("step").time_s
    return (last - first) / (own[last] - own[first])


def run(ctx, name, algorithm, steps, slow, options):
    def sleep_if_slow(record):
        if slow and ctx.rank == SLOW_RANK and record.role == "worker" and record.step < SLOW_STEPS:
            time.sleep(SLEEP_S)

    config = TrainConfig(algorithm=algorithm, steps=steps, options=options, **BASE)
    result = make_trainer(config, ctx, callbacks=[sleep_if_slow]).run()
    if result is None:
        return
    workers = result.steps[result.steps.role == "worker"]
    first = config.length.warmup_steps - 1
    out = {"case": name, "rates": {}}
    for rank, own in workers.groupby("rank"):
        last = min(steps, SLOW_STEPS) - 1 if slow and rank == SLOW_RANK else steps - 1
        out["rates"][int(rank)] = rate(own, first, last)
    if algorithm == "downpour":
        fast = workers[workers["rank"] != SLOW_RANK]
        slow_rank = workers[workers["rank"] == SLOW_RANK]
        # the slow worker's pushes from gradients computed before a sleep, while the fast
        # workers were still pushing too
        overlap = slow_rank[(slow_rank.step >= 1) & (slow_rank.step <= SLOW_STEPS)
                            & (slow_rank.time_s <= fast.time_s.max())]
        out.update(staleness_mean=result.summary["staleness_mean"],
                   staleness_max=result.summary["staleness_max"],
                   slow_rank_staleness_mean=float(overlap.staleness.mean()),
                   slow_rank_pushes_overlapping=len(overlap))
    print(json.dumps(out), flush=True)


def main() -> int:
    ctx = runtime.init(backend="gloo", device="cpu", timeout_s=120)
    assert ctx.world_size == 4, ctx
    downpour = {"servers": 1, "server": "dedicated", "warmstart": 0}
    run(ctx, "downpour", "downpour", 300, False, downpour)
    run(ctx, "downpour, rank 3 slow", "downpour", 300, True, downpour)
    run(ctx, "sync_ps, rank 3 slow", "sync_ps", 15, True, {"server": "dedicated"})
    runtime.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
