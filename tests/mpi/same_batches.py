"""Under mpiexec -n 3: allreduce, sgp and sync_ps (colocated servers) give each worker the same
augmented batches, read by a DataLoader worker process, and train on them. Argument: a directory
holding MNIST's idx files. Rank 0 prints "identical batches: ..." when they agree."""

import hashlib
import sys

import torch

from downpour_lib import TrainConfig, make_trainer, runtime

ALGORITHMS = {"allreduce": None, "sgp": None, "sync_ps": {"server": "colocated"}}


def digest(batches) -> str:
    h = hashlib.sha256()
    for epoch, indices, x, y in batches:
        h.update(str(epoch).encode())
        for t in (indices, x, y):
            h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    ctx = runtime.init(backend="gloo", device="cpu", timeout_s=120)
    seen = {}
    for name, options in ALGORITHMS.items():
        config = TrainConfig(algorithm=name, options=options, dataset="mnist", data_dir=sys.argv[1],
                             model="mlp", batch_size=16, steps=6, warmup_steps=1, threads=1,
                             data_workers=1, seed=4, eval_every=0)
        trainer = make_trainer(config, ctx)
        stream = trainer.batches(range(config.length.steps))
        try:
            seen[name] = digest(stream)
        finally:
            stream.close()
        result = trainer.run()
        if ctx.rank == 0:
            assert len(result.steps) == 3 * config.length.steps, result.steps
    everyone = [None] * ctx.world_size
    torch.distributed.all_gather_object(everyone, seen)
    runtime.shutdown()
    if ctx.rank == 0:
        for rank, digests in enumerate(everyone):
            if len(set(digests.values())) != 1:
                print(f"rank {rank} read different batches: {digests}", flush=True)
                return 1
        if len({d["allreduce"] for d in everyone}) != ctx.world_size:
            print("the workers read the same shard", flush=True)
            return 1
        print("identical batches: " + ", ".join(ALGORITHMS), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
