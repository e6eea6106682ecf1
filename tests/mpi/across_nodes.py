"""Four ranks on two hosts (2 x 2; srun, srun --mpi=pmix or mpiexec in a Slurm allocation): the
communication layer and every algorithm, across nodes.

- ``hosts``: the ranks' host names (two nodes, two ranks each);
- ``collectives``: allreduce sum/avg of small and large buffers, one tensor and a list, exact against
  the closed form; on the mpi backend, ``passes``: how the default group's large allreduces went
  ("nodes": shared memory within each node, MPI between them);
- ``hierarchy``: ``Hierarchy`` over the real node groups equals the flat allreduce;
- ``sync``: sync_ps (dedicated server, 3 workers), ddp and allreduce (4 workers) end with the
  parameters of one process on the N-times batch (max |difference| and how far the reference moved;
  the hosts the run's summary names);
- ``async``: downpour, sgp, osgp, dpsgd and adpsgd train across the nodes: every worker sent and
  received bytes, the final loss is finite.

Rank 0 prints one JSON object; exits non-zero on an exception.
"""

import json
import math
import socket
import sys

import torch
import torch.distributed as dist
from reference import compare, one_process

from downpour_lib import TrainConfig, comm, make_trainer, runtime

BASE = dict(model="mlp", dataset="digits", warmup_steps=1, lr=0.05, momentum=0.9, threads=1, seed=3)
B = 16


def exact_allreduce(ctx) -> dict:
    n, r = ctx.world_size, ctx.rank
    ok = {}
    for numel in (1000, 1 << 20):  # 4 KB (MPI alone) and 4 MB (the shared-memory path)
        base = torch.arange(numel, dtype=torch.float32) % 1000
        x = base + r + 1
        dist.all_reduce(x)
        ok[f"sum {numel}"] = torch.equal(x, n * base + n * (n + 1) / 2)
        y = base * (r + 1)
        dist.all_reduce(y, op=dist.ReduceOp.AVG)
        ok[f"avg {numel}"] = torch.allclose(y, base * (n + 1) / 2)
    many = [torch.full((300_000,), float(r)), torch.full((5,), 2.0 * r)]  # a list, as DDP's buckets
    work = dist.distributed_c10d._get_default_group().allreduce_coalesced(many)
    work.wait()
    ok["coalesced"] = bool((many[0] == sum(range(n))).all() and (many[1] == 2 * sum(range(n))).all())
    result = {"ok": all(ok.values()), "failed": [k for k, v in ok.items() if not v]}
    group = dist.distributed_c10d._get_default_group()
    shm = getattr(group, "_shm", None)
    if shm is not None:
        result["passes"] = dict(shm.passes)
    return result


def hierarchy(ctx) -> dict:
    h = comm.Hierarchy.create()  # the real host names
    x = torch.arange(1 << 16, dtype=torch.float64) * (ctx.rank + 1)
    flat = x.clone()
    comm.allreduce(flat)
    h.allreduce(x)
    return {"ok": torch.equal(x, flat), "local": list(h.local.ranks), "leader": h.is_leader}


def params_after(config: TrainConfig, ctx) -> tuple[list, list, str | None]:
    """Initial and final parameters of this rank, and (rank 0) the hosts the summary names."""
    trainer = make_trainer(config, ctx)
    initial = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.run()
    hosts = result.summary["hosts"] if result is not None else None
    return initial, [p.detach().clone() for p in trainer.model.parameters()], hosts


def worst(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def synchronous(ctx, backend: str) -> dict:
    out = {}
    for name, change, workers in (("sync_ps", dict(options={"server": "dedicated"}), 3),
                                  ("ddp", {}, 4), ("allreduce", {}, 4)):
        config = TrainConfig(**BASE, algorithm=name, steps=8, batch_size=B, backend=backend, **change)
        _, mine, hosts = params_after(config, ctx)
        initial, ref = one_process({**BASE, "steps": 8, "backend": "gloo"}, workers * B)
        c = compare(mine, ref, initial)
        moved, diff = c["reference_moved"], worst(c["max_abs_diff"])
        out[name] = {"max_abs_diff": diff, "reference_moved": moved, "summary_hosts": hosts}
    return out


def asynchronous(ctx, backend: str) -> dict:
    out = {}
    for name, options in (("downpour", {"servers": 1}), ("sgp", {}), ("osgp", {}), ("dpsgd", {}),
                          ("adpsgd", {})):
        config = TrainConfig(**BASE, algorithm=name, steps=5, batch_size=B, backend=backend,
                             options=options)
        trainer = make_trainer(config, ctx)
        result = trainer.run()
        sent = sum(s.bytes_sent for s in trainer.step_records)
        received = sum(s.bytes_received for s in trainer.step_records)
        # every worker sent and received something; servers keep no step records
        quiet = trainer.role == "worker" and (sent == 0 or received == 0)
        silent = worst(1.0 if quiet else 0.0)
        loss = result.summary["final_train_loss"] if result is not None else 0.0
        out[name] = {"every_worker_exchanged": silent == 0.0,
                     "final_train_loss": loss if math.isfinite(loss) else str(loss)}
    return out


def main() -> int:
    backend = sys.argv[1] if len(sys.argv) > 1 else "auto"
    ctx = runtime.init(backend=backend, device="cpu", timeout_s=120)
    hosts = [None] * ctx.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    report = {"hosts": hosts, "backend": ctx.backend, "launcher": ctx.launcher,
              "collectives": exact_allreduce(ctx), "hierarchy": hierarchy(ctx),
              "sync": synchronous(ctx, backend), "async": asynchronous(ctx, backend)}
    if ctx.rank == 0:
        print(json.dumps(report), flush=True)
    runtime.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
