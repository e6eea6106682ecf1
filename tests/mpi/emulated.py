"""Under mpiexec -n 2: emulated compute's gradients are reduced for real, exactly.

Each rank's pseudo-gradients are fixed (EmulatedCompute, seeded by seed + 1000 x rank), so after
k plain SGD steps (no momentum) of an algorithm that averages gradients every step, every
worker's parameters must be p0 - k x lr x (the mean of both ranks' pseudo-gradients). Rank 0
prints one JSON line per algorithm and backend: the largest error, and the summary's loss and
accuracy (absent: NaN) and emulated step.
"""

import json
import math

import torch

from downpour_lib import TrainConfig, make_trainer, runtime
from downpour_lib.emulate import EmulatedCompute

STEPS, LR = 4, 0.1

for backend in ("gloo", "mpi"):
    with runtime.session(backend=backend) as ctx:
        for algorithm in ("allreduce", "ddp"):
            config = TrainConfig(algorithm=algorithm, model="lenet", dataset="synthetic-cifar",
                                 batch_size=8, steps=STEPS, warmup_steps=1, eval_every=0,
                                 optimizer="sgd", lr=LR, momentum=0.0, threads=1,
                                 backend=backend, compute="emulated", emulated_step_s=0.004)
            trainer = make_trainer(config, ctx)
            p0 = [p.detach().clone() for p in trainer.model.parameters()]
            result = trainer.run()
            grads = [EmulatedCompute(trainer.model, trainer.compute, seed=1000 * r).grads
                     for r in range(ctx.world_size)]
            error = max(float((p.detach() - (a - STEPS * LR * sum(g) / len(g))).abs().max())
                        for p, a, *g in zip(trainer.model.parameters(), p0, *grads, strict=True))
            errors = [None] * ctx.world_size
            torch.distributed.all_gather_object(errors, error)
            if result is not None:
                s = result.summary
                print(json.dumps({"algorithm": algorithm, "backend": backend, "errors": errors,
                                  "loss_absent": math.isnan(s["final_train_loss"]),
                                  "accuracy_absent": math.isnan(s["test_accuracy"]),
                                  "emulated_s": s["emulated_forward_s"] + s["emulated_backward_s"],
                                  "bytes_sent": s["bytes_sent_per_step"]}), flush=True)
