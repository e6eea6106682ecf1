"""``downpour bench train``: training throughput and scaling efficiency, algorithms x backends.

Each (algorithm, backend) runs the same configuration once on 1 rank and once under
``mpiexec -n N`` for each N asked for; every run is a real launch of ``downpour train`` (the study's
``launch``), and its throughput is measured after the warm-up steps. One row per run:

- ``samples_per_s``: the run's throughput, all workers together;
- ``scaling_efficiency``: throughput at N workers / (N x throughput at 1 worker, same algorithm and
  backend); 1.0 is linear scaling;
- ``exposed_comm_s``: communication time per step that the backward pass did not hide (the
  engine's comm_s + wait_s: for overlapping algorithms only the wait at the end of backward).

The table also shows each run's throughput relative to DDP on gloo at the same size, when that
pair is in the run. Backends are checked before anything starts: one this build does not have
is refused with the list of those it does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import typing
from typing import Any

import torch
import torch.distributed as dist

from ..algorithms import ALGORITHMS
from ..checkpoint import atomic_write_text
from ..config import TrainConfig
from ..errors import ConfigError, DownpourError
from ..provenance import environment
from ..study.sweep import StudyError, mpiexec_launch

FIELDS = ("algorithm", "backend", "model", "world_size", "samples_per_s", "scaling_efficiency",
          "exposed_comm_s")


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, e.g. 2,4") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="throughput and scaling efficiency of algorithms x backends")
    p.add_argument("--model", default="resnet18", help="(default: resnet18)")
    p.add_argument("--dataset", default="synthetic-cifar", help="(default: synthetic-cifar)")
    p.add_argument("--batch-size", type=int, default=32, help="per worker (default: 32)")
    p.add_argument("--algorithms", type=_names, default=("allreduce", "ddp"),
                   help="comma-separated (default: allreduce,ddp)")
    p.add_argument("--backends", type=_names, default=("gloo",),
                   help="comma-separated torch.distributed backends (default: gloo)")
    p.add_argument("--workers", type=_ints, default=(2,),
                   help="worker counts to compare with 1 worker (default: 2)")
    p.add_argument("--steps", type=int, default=40, help="steps per run (default: 40)")
    p.add_argument("--warmup-steps", type=int, default=10,
                   help="first steps left out of throughput (default: 10)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default: 1)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per point; the median throughput is reported (default: 1)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run (default: 900)")
    p.add_argument("--json", help="write the rows here (a JSON list)")
    p.set_defaults(func=cmd_bench_train)


def known_backends() -> tuple[str, ...]:
    """The backends the run configuration accepts, without 'auto'."""
    hint = typing.get_type_hints(TrainConfig)["backend"]
    return tuple(b for b in typing.get_args(hint) if b != "auto")


def check_backend(name: str) -> None:
    """Refuse a backend this build or machine cannot run, naming the ones it can."""
    known = known_backends()
    usable = [b for b in known if _usable(b)]
    if name not in known:
        raise ConfigError("backends", name, f"this build has no {name!r} backend; use one of "
                          + ", ".join(usable))
    if not _usable(name):
        raise ConfigError("backends", name, f"{name!r} cannot run here (nccl needs CUDA GPUs); use "
                          "one of " + ", ".join(usable))


def _usable(name: str) -> bool:
    if name == "gloo":
        return dist.is_gloo_available()
    if name == "nccl":
        return dist.is_nccl_available() and torch.cuda.is_available()
    return True  # other registered backends say for themselves when they start


def plan(args: argparse.Namespace) -> list[tuple[TrainConfig, str, int, int]]:
    """(config, backend, workers, ranks) of every run, validated before anything is launched."""
    for backend in args.backends:
        check_backend(backend)
    if not args.workers or min(args.workers) < 2:
        raise ConfigError("workers", args.workers, "give worker counts >= 2 to compare with 1")
    if args.repeats < 1:
        raise ConfigError("repeats", args.repeats, "must be >= 1")
    runs = []
    for algorithm in args.algorithms:
        if algorithm not in ALGORITHMS:
            raise ConfigError("algorithms", algorithm, "choose from " + ", ".join(ALGORITHMS))
        for backend in args.backends:
            config = TrainConfig.from_dict({
                "algorithm": algorithm, "backend": backend, "model": args.model,
                "dataset": args.dataset, "batch_size": args.batch_size, "steps": args.steps,
                "warmup_steps": args.warmup_steps, "threads": args.threads, "device": "cpu",
                "eval_every": 0, "eval_batch_size": 64, "seed": 0})
            cls = ALGORITHMS[algorithm]
            for workers in (1, *args.workers):
                runs.append((config, backend, workers, cls.world_size_for(config.options, workers)))
    return runs


def run_bench(args: argparse.Namespace, log=print) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    base: dict[tuple[str, str], float] = {}
    for config, backend, workers, ranks in plan(args):
        summaries = []
        for _ in range(args.repeats):
            summaries.append(mpiexec_launch(config, ranks, args.timeout))
            log(f"  {config.algorithm:<10} {backend:<5} {ranks} rank(s): "
                f"{summaries[-1]['samples_per_s']:.1f} samples/s")
        rate = statistics.median(s["samples_per_s"] for s in summaries)
        pick = min(summaries, key=lambda s: abs(s["samples_per_s"] - rate))
        if workers == 1:
            base[(config.algorithm, backend)] = rate
        rows.append({
            "algorithm": config.algorithm, "backend": backend, "model": config.model,
            "world_size": ranks, "num_workers": workers, "samples_per_s": rate,
            "scaling_efficiency": rate / (workers * base[(config.algorithm, backend)]),
            "exposed_comm_s": pick["comm_s"] + pick["wait_s"] if ranks > 1 else 0.0,
            "step_s": pick["step_s"], "compute_s": pick["compute_s"],
            "bytes_sent_per_step": pick["bytes_sent_per_step"], "batch_size": config.batch_size,
            "steps": config.steps, "warmup_steps": config.warmup_steps, "threads": config.threads,
            "repeats": args.repeats, "hosts": pick["hosts"],
            **{k: pick.get(k, v) for k, v in environment().items()},  # as the run saw it
        })
    reference = {(r["num_workers"]): r["samples_per_s"] for r in rows
                 if r["algorithm"] == "ddp" and r["backend"] == "gloo"}
    for row in rows:
        ref = reference.get(row["num_workers"])
        row["vs_ddp_gloo"] = row["samples_per_s"] / ref if ref else None
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    header = ("algorithm", "backend", "ranks", "samples/s", "efficiency", "exposed comm s",
              "vs ddp/gloo")
    cells = [header] + [
        (r["algorithm"], r["backend"], str(r["world_size"]), f"{r['samples_per_s']:.1f}",
         f"{r['scaling_efficiency']:.3f}", f"{r['exposed_comm_s']:.4f}",
         "-" if r["vs_ddp_gloo"] is None else f"{r['vs_ddp_gloo']:.2f}x") for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())


def cmd_bench_train(args: argparse.Namespace) -> int:
    try:
        runs = plan(args)  # every check before the first launch
        print(f"downpour bench train: {len(runs) * args.repeats} run(s) of {args.model} on "
              f"{args.dataset}, batch {args.batch_size} per worker", flush=True)
        rows = run_bench(args, log=lambda line: print(line, flush=True))
    except ConfigError as exc:
        print(f"downpour bench train: error: {exc}", file=sys.stderr)
        return 2
    except (StudyError, DownpourError) as exc:
        print(f"downpour bench train: {exc}", file=sys.stderr)
        return 1
    print_table(rows)
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0
