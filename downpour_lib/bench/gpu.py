"""``downpour bench gpu``: what our training costs on one GPU, and whether the data keeps it busy.

Two measurements, on ``cuda:0`` in this process (a world of one):

- **overhead**: each algorithm's throughput (``Trainer``, the same model, data, batch and
  precision) against a plain PyTorch loop (``plain.plain_loop``: forward under autocast,
  backward, ``optimizer.step``) on the same model and synthetic batches, gathered on the host,
  pinned and copied without blocking; and against that loop on one batch resident on the GPU, the
  model's own cost and a ceiling for any data path. The overhead is what we cost beyond the
  model: 1 - our images/s over the resident loop's. The goal is <= 5% for resnet50 on
  synthetic-imagenet in bf16.
- **pipeline**: images per second that the ImageFolder pipeline (JPEGs decoded, random-resized-
  cropped and flipped in DataLoader workers, pinned, copied to the GPU) delivers, against the plain
  loop's images per second: above 1 the pipeline is not the bottleneck. The JPEGs are generated
  (``data.generate``), 500 x 375 like an average ImageNet photograph.

Without CUDA it says so and exits 0: there is nothing to measure, and nothing is pretended.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..algorithms import ALGORITHMS
from ..checkpoint import atomic_write_text
from ..comm.runtime import DistContext
from ..config import TrainConfig
from ..data import ShardSampler, load_dataset
from ..data.generate import write_imagefolder
from ..data.loader import TrainBatches
from ..data.sources import is_language_model
from ..engine import train
from ..errors import ConfigError
from ..provenance import environment
from ..records import device_sync
from .plain import plain_loop


def one_gpu_algorithms() -> list[str]:
    """The algorithms that run in a world of one (the others need a server or a peer)."""
    out = []
    for name, cls in ALGORITHMS.items():
        try:
            cls.Options().roles(1)
        except ConfigError:
            continue
        out.append(name)
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gpu", help="one GPU: each algorithm against a plain PyTorch loop, and the "
                                   "ImageFolder pipeline against the model")
    p.add_argument("--model", default="resnet50", help="(default: resnet50)")
    p.add_argument("--dataset", default="synthetic-imagenet", help="(default: synthetic-imagenet)")
    p.add_argument("--batch-size", type=int, default=128, help="(default: 128)")
    p.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "fp16"),
                   help="(default: bf16)")
    p.add_argument("--steps", type=int, default=60, help="steps per run (default: 60)")
    p.add_argument("--warmup-steps", type=int, default=15, help="(default: 15)")
    p.add_argument("--algorithms", default=",".join(one_gpu_algorithms()),
                   help="comma-separated (default: every algorithm at world size 1)")
    p.add_argument("--images", type=int, default=2048, help="generated JPEGs (default: 2048)")
    p.add_argument("--pipeline-rounds", type=int, default=4,
                   help="batches per DataLoader worker timed, after each worker's first (default: 4)")
    p.add_argument("--data-workers", type=int, default=None,
                   help="DataLoader workers for the pipeline (default: every core)")
    p.add_argument("--json", default=None,
                   help="write the rows here (default: results/<host>/gpu/bench.json)")
    p.set_defaults(func=main, output_files=("json",))


def pipeline(images: int, batch: int, workers: int, rounds: int, device: torch.device) -> float:
    """Images per second out of the ImageFolder pipeline onto the device, in its steady state:
    each DataLoader worker makes one batch at a time, so the first round (a batch from each, all
    ready at once after the workers' start) is left out and ``rounds`` more are timed (the data
    cycled through as epochs). Timed from the third batch of 16 workers' first round instead, an
    H200 node's 16 cores read 26,124 images/s (512 images) and 5,336 (2,048) on another day: the
    batches already made, not the decoding."""
    with tempfile.TemporaryDirectory() as tmp:
        classes = 16
        root = write_imagefolder(tmp, classes=classes, per_class=max(1, images // classes),
                                 size=(500, 375), val_per_class=1)
        images_set = load_dataset("imagefolder", root).train
        sampler = ShardSampler(len(images_set), batch, 0, 1, 0)
        first = max(1, workers)
        stream = TrainBatches(images_set, sampler, range(first * (rounds + 1)), True, 0, workers, device)
        try:
            count, start = 0, None
            for i, (_, _, x, _) in enumerate(stream):
                if i == first:
                    device_sync(device)
                    start, count = time.perf_counter(), 0
                count += len(x)
            device_sync(device)
            return count / (time.perf_counter() - start)
        finally:
            stream.close()


def measure(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    """The table's rows: the plain loop, each algorithm, the pipeline."""
    names = [n.strip() for n in args.algorithms.split(",") if n.strip()]
    same = {"model": args.model, "dataset": args.dataset, "batch_size": args.batch_size,
            "precision": args.precision, "steps": args.steps, "warmup_steps": args.warmup_steps,
            "device": device.type, "final_eval": False, "optimizer": "sgd", "momentum": 0.9}
    loop = TrainConfig(algorithm="local", lr=0.01, **same)  # its batches, seed 0, SGD at lr 0.01
    base = plain_loop(loop, device)
    ceiling = plain_loop(loop, device, resident=True)
    rows: list[dict[str, Any]] = [{"what": "plain PyTorch loop", "images_per_s": base},
                                  {"what": "plain loop, batch resident on the GPU",
                                   "images_per_s": ceiling}]
    for name in names:
        summary = train(TrainConfig(algorithm=name, **same), DistContext.single(device)).summary
        rows.append({"what": name, "images_per_s": summary["samples_per_s"]})
    source = load_dataset(args.dataset).train
    if is_language_model(source):  # tokens come from memory: no image pipeline to keep up
        context = source.input_shape[0]
        rows = [{**row, "tokens_per_s": row["images_per_s"] * context} for row in rows]
    else:
        workers = args.data_workers if args.data_workers is not None else len(os.sched_getaffinity(0))
        rate = pipeline(args.images, args.batch_size, workers, args.pipeline_rounds, device)
        rows.append({"what": f"imagefolder pipeline ({workers} workers)", "images_per_s": rate})
    return [{**row, "vs_plain": row["images_per_s"] / base,
             "vs_resident": row["images_per_s"] / ceiling} for row in rows]


def table(rows: list[dict[str, Any]]) -> list[str]:
    """``measure``'s rows as lines; an algorithm's overhead is what it costs beyond the model
    alone: 1 - its images/s over the resident loop's."""
    lines = [f"{'what':<38} {'samples/s':>10} {'vs plain':>9} {'vs resident':>12} {'overhead':>9}"
             + (f" {'tokens/s':>11}" if rows and "tokens_per_s" in rows[0] else "")]
    for row in rows:
        overhead = "" if row["what"].startswith(("plain", "imagefolder")) else \
            f"{(1 - row['vs_resident']) * 100:8.1f}%"
        lines.append(f"{row['what']:<38} {row['images_per_s']:10.1f} {row['vs_plain']:9.3f} "
                     f"{row['vs_resident']:12.3f} {overhead:>9}"
                     + (f" {row['tokens_per_s']:11.0f}" if "tokens_per_s" in row else ""))
    return lines


def main(args: argparse.Namespace) -> int:
    if args.pipeline_rounds < 1:
        raise ConfigError("pipeline_rounds", args.pipeline_rounds,
                          "batches per DataLoader worker to time after its first: 1 or more")
    if not torch.cuda.is_available():
        print(f"downpour bench gpu: no CUDA device on {socket.gethostname()} (torch "
              f"{torch.__version__}, CUDA build {torch.version.cuda or 'none'}); nothing to measure. "
              "Run it on a GPU node.")
        return 0
    rows = measure(args, torch.device("cuda", 0))
    print(f"{args.model}, {args.dataset}, batch {args.batch_size}, {args.precision}, "
          f"{torch.cuda.get_device_name(0)}")
    print("\n".join(table(rows)))
    out = Path(args.json or Path("results") / socket.gethostname() / "gpu" / "bench.json")
    env = environment()
    atomic_write_text(out, json.dumps([{**row, "model": args.model, "dataset": args.dataset,
                                        "batch_size": args.batch_size,
                                        "precision": args.precision,
                                        "gpu": torch.cuda.get_device_name(0), **env}
                                       for row in rows], indent=1) + "\n")
    print(f"wrote {out}")
    return 0
