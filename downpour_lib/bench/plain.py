"""The plain PyTorch loop: the reference that ``bench train`` and ``bench gpu`` set our training beside.

The loop everyone writes first, one process and no downpour: each batch read as one worker reads it,
forward (under autocast for bf16 or fp16), the loss, backward, the optimizer's step, the loss read back
(as the engine reads it every step). ``bench train`` runs it on the CPU with the run's threads, in a
fresh process; ``bench gpu`` on ``cuda:0``, each batch pinned and copied without blocking, and once
more with one batch resident on the GPU (what the model alone costs).
"""

from __future__ import annotations

import time

import torch

from ..config import TrainConfig
from ..data import ShardSampler, load_dataset
from ..engine import build_optimizer, task_loss
from ..models import build_model
from ..precision import autocast
from ..records import device_sync


def plain_loop(config: TrainConfig, device: torch.device | None = None, resident: bool = False,
               threads: int | None = None) -> float:
    """Samples per second of a plain PyTorch loop on ``config``'s model, data, batch, seed,
    optimizer, precision, steps and warm-up steps, in this process on ``device`` (default: the CPU),
    with ``threads`` torch threads (default: torch's own). On CUDA each batch is gathered on the
    host, pinned (as a DataLoader with ``pin_memory=True`` hands it) and copied without blocking,
    and the clock waits for the GPU at both ends. With ``resident``, one batch made on the device
    once and used every step: what the model alone costs, the ceiling no data path reaches."""
    device = device if device is not None else torch.device("cpu")
    if threads is not None:
        torch.set_num_threads(threads)
    data = config.data
    train = load_dataset(data.dataset, data.data_dir).train
    torch.manual_seed(data.seed)
    model = build_model(config.model, train.input_shape, train.num_classes).to(device)
    optimizer = build_optimizer(config, model.parameters())
    sampler = ShardSampler(len(train), data.batch_size, 0, 1, data.seed)
    on_device = None
    if resident:
        x, y = train.batch(sampler.indices(0)[1])
        on_device = x.to(device), y.to(device)
    steps, warmup = config.length.steps, config.length.warmup_steps
    start = 0.0
    for step in range(steps):
        if step == warmup:
            device_sync(device)
            start = time.perf_counter()
        if on_device is not None:
            x, y = on_device
        else:
            x, y = train.batch(sampler.indices(step)[1])
            if device.type == "cuda":
                x, y = x.pin_memory(), y.pin_memory()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with autocast(config.optim.precision, device):
            loss = task_loss(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()  # the engine reads every step's loss too
    device_sync(device)
    return (steps - warmup) * data.batch_size / (time.perf_counter() - start)
