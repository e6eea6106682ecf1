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
pair is in the run, and relative to the ceiling below (``vs_ceiling``: N workers against N
independent processes, round by round, the median of the ratios): what the algorithm and backend
cost, with the machine's own contention taken out. Backends are checked before anything starts:
one this build does not have is refused with the list of those it does.

The ceiling: on a machine whose cores all compute, N processes are slower than one even when they
never communicate (they share memory bandwidth, caches and the operating system's attention). So
every round also runs ``local`` alone and N copies of it at once, as independent processes; that
row (algorithm ``independent``, backend ``none``) is the best scaling efficiency any algorithm can
show on this machine, as ``bench collectives`` reports memcpy beside the collectives.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..algorithms import ALGORITHMS
from ..cluster.mpiexec import RunFailed, mpiexec_launch
from ..comm.runtime import backend_usable
from ..config import Data, TrainConfig
from ..defaults import RUN_TIMEOUT_S
from ..errors import ConfigError
from ..provenance import environment
from .report import DATASET, THREADS, WARMUP_STEPS, print_columns, run_command

INDEPENDENT = "independent"  # the ceiling's rows: N copies of `local` that never communicate


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
    p.add_argument("--dataset", default=DATASET, help="(default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=Data.batch_size,
                   help="per worker (default: %(default)s)")
    p.add_argument("--algorithms", type=_names, default=("allreduce", "ddp"),
                   help="comma-separated (default: allreduce,ddp)")
    p.add_argument("--backends", type=_names, default=("gloo",),
                   help="comma-separated torch.distributed backends (default: gloo)")
    p.add_argument("--workers", type=_ints, default=(2,),
                   help="worker counts to compare with 1 worker (default: 2)")
    p.add_argument("--steps", type=int, default=40, help="steps per run (default: 40)")
    p.add_argument("--warmup-steps", type=int, default=WARMUP_STEPS,
                   help="first steps left out of throughput (default: %(default)s)")
    p.add_argument("--threads", type=int, default=THREADS,
                   help="torch threads per rank (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3,
                   help="rounds of every run; each point reports its median throughput (default: 3)")
    p.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                   help="leave out the independent-processes rows (the machine's ceiling)")
    p.add_argument("--no-plain", dest="plain", action="store_false",
                   help="leave out the plain PyTorch loop's row (one process, no downpour)")
    p.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S,
                   help="seconds per run (default: %(default)g)")
    p.add_argument("--json", help="write the rows here (a JSON list)")
    p.set_defaults(func=cmd_bench_train, output_files=("json",))


def known_backends() -> tuple[str, ...]:
    """The backends the run configuration accepts, without 'auto'."""
    hint = TrainConfig.flat_hints()["backend"]
    return tuple(b for b in typing.get_args(hint) if b != "auto")


def check_backend(name: str) -> None:
    """Refuse a backend this build or machine cannot run, naming the ones it can."""
    known = known_backends()
    usable = [b for b in known if backend_usable(b)]
    if name not in known:
        raise ConfigError("backends", name, f"this build has no {name!r} backend; use one of "
                          + ", ".join(usable))
    if not backend_usable(name):
        raise ConfigError("backends", name, f"{name!r} cannot run here (nccl needs CUDA GPUs); use "
                          "one of " + ", ".join(usable))


@dataclass(frozen=True)
class Run:
    """One point of the benchmark: ``config`` with ``workers`` workers on ``ranks`` ranks, launched
    by mpiexec, or (``backend`` "none") as that many independent processes."""

    config: TrainConfig
    backend: str
    workers: int
    ranks: int

    @property
    def independent(self) -> bool:
        return self.config.algorithm == "local"

    @property
    def algorithm(self) -> str:
        return INDEPENDENT if self.independent else self.config.algorithm

    def launch(self, timeout_s: float) -> dict[str, Any]:
        if not self.independent:
            return mpiexec_launch(self.config, self.ranks, timeout_s)
        runs = independent_launch(self.config, self.workers, timeout_s)
        return {**runs[0], "samples_per_s": sum(r["samples_per_s"] for r in runs)}


def plan(args: argparse.Namespace) -> list[Run]:
    """Every run, validated before anything is launched."""
    for backend in args.backends:
        check_backend(backend)
    if not args.workers or min(args.workers) < 2:
        raise ConfigError("workers", args.workers, "give worker counts >= 2 to compare with 1")
    if args.repeats < 1:
        raise ConfigError("repeats", args.repeats, "must be >= 1")
    runs = []
    for algorithm in args.algorithms:
        if algorithm not in ALGORITHMS or algorithm == "local":
            raise ConfigError("algorithms", algorithm, "choose from " + ", ".join(
                a for a in ALGORITHMS if a != "local"))
    for algorithm, backend in [(a, b) for a in args.algorithms for b in args.backends] \
            + ([("local", "none")] if args.ceiling else []):
        config = TrainConfig.from_dict({
            "algorithm": algorithm, "backend": "gloo" if backend == "none" else backend,
            "model": args.model, "dataset": args.dataset, "batch_size": args.batch_size,
            "steps": args.steps, "warmup_steps": args.warmup_steps, "threads": args.threads,
            "device": "cpu", "eval_every": 0, "eval_batch_size": 64, "seed": 0})
        for workers in (1, *args.workers):
            # the local algorithm is the ceiling's row: N independent copies of one process
            ranks = workers if algorithm == "local" else config.options.roles_for(workers).world_size
            runs.append(Run(config, backend, workers, ranks))
    return runs


def independent_launch(config: TrainConfig, n: int, timeout_s: float) -> list[dict[str, Any]]:
    """``n`` single-process runs of ``config`` at the same time; their summaries."""
    with tempfile.TemporaryDirectory(prefix="downpour-independent-") as tmp:
        cfg = Path(tmp) / "config.json"
        cfg.write_text(json.dumps(config.to_dict(), default=str))
        outs = [Path(tmp) / f"summary{i}.json" for i in range(n)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
        procs = [subprocess.Popen([sys.executable, "-m", "downpour_lib", "train", "--config",
                                   str(cfg), "--summary-json", str(out)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for out in outs]
        failed = []
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if proc.returncode != 0:
                failed.append(f"exit {proc.returncode}: " + "\n".join(err.splitlines()[-10:]))
        if failed:
            raise RunFailed(f"{n} independent run(s) of local failed: {failed[0]}")
        return [json.loads(out.read_text()) for out in outs]


PLAIN = "plain loop"  # the reference row: the loop everyone writes first, one process


def plain_launch(config: TrainConfig, timeout_s: float) -> dict[str, Any]:
    """The plain PyTorch loop (``plain.plain_loop``) on ``config``'s model, data, batch, optimizer
    and threads, on the CPU in a fresh process, as each run is one (the same start, the same
    imports)."""
    code = ("import json, sys; from downpour_lib.config import TrainConfig; "
            "from downpour_lib.bench.plain import plain_loop; "
            "config = TrainConfig.from_dict(json.loads(sys.argv[1])); "
            "print(plain_loop(config, threads=config.system.threads or 1))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(config.to_dict(), default=str)],
                          capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise RunFailed(f"the plain loop failed: {proc.stderr.strip().splitlines()[-1:]}")
    return {"samples_per_s": float(proc.stdout.split()[-1])}


def run_bench(args: argparse.Namespace, log=print) -> list[dict[str, Any]]:
    """Every run of the plan, ``repeats`` rounds of them: a round launches each run once, so a slow
    spell of a shared machine lands on every point alike instead of on one; each point reports the
    median of its rounds."""
    runs = plan(args)
    summaries: list[list[dict[str, Any]]] = [[] for _ in runs]
    plain: list[float] = []
    for round_ in range(args.repeats):
        if args.plain:
            plain.append(plain_launch(runs[0].config, args.timeout)["samples_per_s"])
            log(f"  [{round_ + 1}/{args.repeats}] {PLAIN:<11} 1 process: {plain[-1]:.1f} samples/s")
        for run, seen in zip(runs, summaries, strict=True):
            seen.append(run.launch(args.timeout))
            log(f"  [{round_ + 1}/{args.repeats}] {run.algorithm:<11} {run.backend:<5} {run.ranks} "
                f"{'process(es)' if run.independent else 'rank(s)'}: "
                f"{seen[-1]['samples_per_s']:.1f} samples/s")
    rows: list[dict[str, Any]] = []
    base: dict[tuple[str, str], float] = {}
    for run, seen in zip(runs, summaries, strict=True):
        config, workers = run.config, run.workers
        rate = statistics.median(s["samples_per_s"] for s in seen)
        pick = min(seen, key=lambda s: abs(s["samples_per_s"] - rate))
        if workers == 1:
            base[(run.algorithm, run.backend)] = rate
        communicates = run.ranks > 1 and not run.independent
        rows.append({
            "algorithm": run.algorithm, "backend": run.backend, "model": config.model,
            "world_size": run.ranks, "num_workers": workers, "samples_per_s": rate,
            "samples_per_s_runs": [s["samples_per_s"] for s in seen],
            "scaling_efficiency": rate / (workers * base[(run.algorithm, run.backend)]),
            "exposed_comm_s": pick["comm_s"] + pick["wait_s"] if communicates else 0.0,
            "step_s": pick["step_s"], "compute_s": pick["compute_s"],
            "bytes_sent_per_step": pick["bytes_sent_per_step"],
            "batch_size": config.data.batch_size, "steps": config.length.steps,
            "warmup_steps": config.length.warmup_steps, "threads": config.system.threads,
            "repeats": args.repeats, "hosts": pick["hosts"],
            **{k: pick.get(k, v) for k, v in environment().items()},  # as the run saw it
        })
    context = _tokens_per_sample(runs[0].config)
    if plain:
        rows.insert(0, {"algorithm": PLAIN, "backend": "none", "model": runs[0].config.model,
                        "world_size": 1, "num_workers": 1, "samples_per_s": statistics.median(plain),
                        "samples_per_s_runs": plain, "scaling_efficiency": 1.0,
                        "exposed_comm_s": 0.0, "repeats": args.repeats, **environment()})
    for row in rows:
        # each worker's own rate against the plain loop's, round by round, then the median
        row["per_worker_vs_plain"] = statistics.median(
            a / row["num_workers"] / b for a, b in zip(row["samples_per_s_runs"], plain,
                                                      strict=True)) if plain else None
        if context:
            row["tokens_per_s"] = row["samples_per_s"] * context
    reference = {(r["num_workers"]): r["samples_per_s"] for r in rows
                 if r["algorithm"] == "ddp" and r["backend"] == "gloo"}
    ceiling = {r["num_workers"]: r["samples_per_s_runs"] for r in rows
               if r["algorithm"] == INDEPENDENT}
    for row in rows:
        ref = reference.get(row["num_workers"])
        row["vs_ddp_gloo"] = row["samples_per_s"] / ref if ref else None
        # round by round, against the ceiling's run of the same round (the same spell of the
        # machine), then the median
        top = ceiling.get(row["num_workers"])
        row["vs_ceiling"] = statistics.median(
            a / b for a, b in zip(row["samples_per_s_runs"], top, strict=True)) if top else None
    return rows


def _tokens_per_sample(config: TrainConfig) -> int | None:
    """A language model's context (its throughput is also told in tokens), else None."""
    from ..data import DATASETS

    spec = DATASETS.get(config.data.dataset)
    return spec.input_shape[0] if spec is not None and spec.task == "lm" else None


def print_table(rows: list[dict[str, Any]]) -> None:
    tokens = bool(rows) and "tokens_per_s" in rows[0]
    header = ("algorithm", "backend", "ranks", "samples/s", *(("tokens/s",) if tokens else ()),
              "efficiency", "exposed comm s", "per worker vs plain", "vs ddp/gloo", "of ceiling")
    cells = [header] + [
        (r["algorithm"], r["backend"], str(r["world_size"]), f"{r['samples_per_s']:.1f}",
         *((f"{r['tokens_per_s']:.0f}",) if tokens else ()),
         f"{r['scaling_efficiency']:.3f}", f"{r['exposed_comm_s']:.4f}",
         "-" if r.get("per_worker_vs_plain") is None else f"{r['per_worker_vs_plain']:.3f}",
         "-" if r["vs_ddp_gloo"] is None else f"{r['vs_ddp_gloo']:.2f}x",
         "-" if r["vs_ceiling"] is None else f"{r['vs_ceiling']:.3f}") for r in rows]
    print_columns(cells)


def cmd_bench_train(args: argparse.Namespace) -> int:
    def launch() -> list[dict[str, Any]]:
        runs = plan(args)  # every check before the first launch
        launches = (len(runs) + bool(args.plain)) * args.repeats  # the plain loop's too
        print(f"downpour bench train: {launches} launch(es) of {args.model} on "
              f"{args.dataset}, batch {args.batch_size} per worker", flush=True)
        return run_bench(args, log=lambda line: print(line, flush=True))

    return run_command("train", launch, print_table, args.json)
