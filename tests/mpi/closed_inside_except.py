"""Under mpiexec -n 2: a run trained inside an unrelated ``except`` block still closes properly.

A notebook or a user's script may call training while handling some other exception. The
algorithms used to guess how the run ended from ``sys.exc_info()``, so there a *successful* run's
close skipped Overlap-SGP's drain (push-sum mass in flight, lost), abandoned AD-PSGD's averaging
thread and left a colocated Downpour server thread unjoined. The engine now says how the run ended.
Rank 0 prints one JSON line per case.
"""

import json
import sys
import threading

import torch
import torch.distributed as dist

from downpour_lib import TrainConfig, runtime
from downpour_lib.engine import Trainer, make_trainer

BASE = dict(model="mlp", dataset="digits", batch_size=16, steps=12, lr=0.05, final_eval=False,
            warmup_steps=1, backend="mpi")
CASES = [
    ("osgp", dict(algorithm="osgp", options={"max_lag": 2})),
    ("adpsgd", dict(algorithm="adpsgd")),
    ("downpour colocated", dict(algorithm="downpour", options={"servers": 1,
                                                                "server": "colocated"})),
]


def threads_of(algorithm) -> list[threading.Thread]:
    """The algorithm's own threads, while it trains: AD-PSGD's averaging thread, a colocated
    Downpour server's loop."""
    owner = getattr(algorithm, "averaging", None) or getattr(algorithm, "thread", None)
    thread = getattr(owner, "_thread", None)
    return [thread] if thread is not None else []


def total(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t)


def train_while_handling(config: TrainConfig, ctx) -> tuple[Trainer, set[threading.Thread], int]:
    """Train inside an ``except`` block; the algorithm's threads seen while training, and how
    many of them are alive when the run returns."""
    seen: set[threading.Thread] = set()
    try:
        raise KeyError("an unrelated error the caller is handling")
    except KeyError:
        trainer = make_trainer(config, ctx, callbacks=[lambda _: seen.update(threads_of(trainer.algorithm))])
        trainer.run()
        return trainer, seen, sum(t.is_alive() for t in seen)  # right away: joined ones ended


def main() -> int:
    ctx = runtime.init(backend="mpi", device="cpu", timeout_s=60)
    for name, change in CASES:
        trainer, seen, alive = train_while_handling(TrainConfig(**BASE, **change), ctx)
        algorithm = trainer.algorithm
        case = {"case": name, "threads": total(len(seen)), "threads_alive": total(alive)}
        if name == "adpsgd":  # close() joins the thread, then frees the pairs' group
            case["unjoined"] = total(algorithm.group is not None)
        if name.startswith("downpour"):  # close() joins the server thread, then forgets it
            case["unjoined"] = total(algorithm.thread is not None)
        if name == "osgp":  # push-sum weights sum to the world size when no mass is in flight
            case["in_flight"] = total(len(algorithm.in_flight))
            case["weight_sum"] = total(algorithm.push_sum.weight)
        if ctx.rank == 0:
            print(json.dumps(case), flush=True)
    runtime.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
